"""MFU: the peak table keyed by NVML's name, the FLOPs of a step, TFLOP/s and MFU from a rank's
metrics to the exporter and kit ps's words; the GPU's name from NVML (the test library naming an H100), and
"n/a" — never 0 — on a CPU or a GPU the table does not know."""

from __future__ import annotations

import json

import pytest
from fake_gpus import FakeGpus, preload

from kit.monitor import peaks


@pytest.mark.parametrize(
    "name, model",
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA GB200", "GB200"),
        ("Tesla V100-SXM2-32GB", None),
        ("", None),
        (None, None),
    ],
)
def test_the_peak_table_knows_each_model_by_nvmls_name_and_no_other(name, model):
    known = peaks.model_of(name)
    assert (known[0] if known else None) == model
    if model:  # every model has every precision, dense bf16 far above fp32, each row with its source
        bf16, fp16, fp32 = (peaks.peak_tflops(name, p) for p in ("bf16-mixed", "16-mixed", "32-true"))
        assert bf16 == fp16 and bf16 > 3 * fp32 > 0 and known[2].startswith("NVIDIA")
    else:
        assert peaks.peak_tflops(name, "bf16") is None and peaks.mfu(100.0, name, "bf16") is None


def test_precisions_in_lightnings_and_torchs_spellings():
    assert [
        peaks.precision_of(p)
        for p in (
            "bf16-mixed",
            "bf16-true",
            "torch.bfloat16",
            "16-mixed",
            "32-true",
            "32",
            "64-true",
            "transformer-engine",
            None,
        )
    ] == ["bf16", "bf16", "bf16", "fp16", "fp32", "fp32", None, None, None]
    assert peaks.peak_tflops("NVIDIA H100 80GB HBM3", "bf16-mixed") == 989.5  # the datasheet's 1,979 sparse / 2
    assert peaks.peak_tflops("NVIDIA H100 80GB HBM3", "64-true") is None


def test_the_reference_models_flops_per_step_are_the_6n_rule():
    """flop_counter's forward x 3 for kit.train's MLP: 6 x its weights x the batch (biases aside)."""
    import torch

    from kit.train import mfu
    from kit.train.main import Regression

    model = Regression(features=32, hidden=64)
    batch = (torch.randn(64, 32), torch.randn(64, 1))
    assert mfu.flops_per_step(model, batch) == 6 * (32 * 64 + 64 * 1) * 64
    assert all(p.grad is None for p in model.parameters())  # counting did not touch the training


def test_the_gpts_flops_per_step_are_the_6n_rule_plus_attention_as_torch_counts_a_step():
    """kit.train's GPT says a step is (6·N + 12·layers·d_model·seq)·tokens. torch's counter, over a real forward
    and backward pass, finds 6·(N less the parameters no matmul uses: biases, layer norms)·tokens exactly — its
    CPU attention kernel it does not count — and, over attention written as matmuls at the model's shapes, the
    rule's 12·d_model·seq per token and layer exactly."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from kit.train.gpt import GPT

    b, t, d, layers, heads = 4, 32, 64, 2, 4
    model = GPT(vocab=256, d_model=d, layers=layers, heads=heads, seq=t, batch=b)
    n = model.counted_parameters()
    assert n == sum(p.numel() for p in model.parameters()) - t * d  # the positions are not in N
    x, y = model.tokens()
    counter = FlopCounterMode(display=False)
    with counter:
        logits = model(x)
        torch.nn.functional.cross_entropy(logits.reshape(-1, 256), y.reshape(-1)).backward()
    no_matmul = sum(p.numel() for p in model.parameters() if p.ndim == 1)
    assert counter.get_total_flops() == 6 * (n - no_matmul) * b * t

    q, k, v = (torch.randn(b, heads, t, d // heads, requires_grad=True) for _ in range(3))
    attention = FlopCounterMode(display=False)
    with attention:
        (torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v).sum().backward()
    assert layers * attention.get_total_flops() == 12 * layers * d * t * b * t
    assert model.flops_per_step() == (6 * n + 12 * layers * d * t) * b * t
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal((x[:, 1:] - x[:, :-1]) % 256, torch.ones(b, t - 1).long())


def test_the_gpt_trains_on_the_cpu_from_ln_vocab_down():
    """`python -m kit.train --model gpt` on one CPU process: its first loss is a uniform guess's (ln 256), it
    learns the sequence, and it says its size and a step's FLOPs."""
    import math
    import re
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "kit.train", "--model", "gpt", "--max-steps", "40", "--batch-size", "8"]
        + ["--checkpoint-every", "0", "--log-every", "10"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    first, last = map(float, re.search(r"first_loss=([0-9.]+) last_loss=([0-9.]+)", proc.stdout).groups())
    assert abs(first - math.log(256)) < 0.3 and last < first / 2, proc.stdout
    assert re.search(r"gpt: \d+ parameters, \d+ FLOPs per step per rank", proc.stdout), proc.stdout


def test_mfu_against_the_h100_nvml_names_and_na_on_a_cpu(tmp_path, monkeypatch):
    from kit.train import mfu

    gpus = FakeGpus(tmp_path / "nvml-state", count=2)
    preload()
    for k, v in gpus.env().items():
        monkeypatch.setenv(k, v)
    name = mfu.nvml_name("1")
    assert name == "NVIDIA H100 80GB HBM3" and mfu.nvml_name("GPU-00000000-fake") == name
    assert mfu.nvml_name("7") is None  # no such GPU: no name, no MFU
    on_gpu = mfu.Throughput(flops_per_step=4e13, precision="bf16-mixed", gpu_name=name)
    for _ in range(10):
        on_gpu.step()
    values = on_gpu.values(1.0)
    assert values["tflops"] == pytest.approx(400.0) and values["mfu"] == pytest.approx(400.0 / 989.5)
    assert on_gpu.values(1.0) == {}  # counted afresh after each write
    on_cpu = mfu.Throughput(flops_per_step=4e9, precision="32-true", gpu_name=mfu.device_name())
    on_cpu.step()
    assert on_cpu.values(2.0) == {"tflops": pytest.approx(0.002)}  # no "mfu": n/a, not 0


def test_the_device_a_script_trains_on_is_the_one_measured(tmp_path, monkeypatch):
    """On a GPU node (NVML's test library naming H100s, torch's CUDA answering for GPU 1 of them): by default
    the current CUDA device, "cuda:0" the first visible one; a script on the node's CPU ("cpu") is n/a, never
    measured against the GPU."""
    import sys
    import types

    from kit.train import mfu

    for k, v in FakeGpus(tmp_path / "nvml-state", count=2).env().items():
        monkeypatch.setenv(k, v)
    preload()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    cuda = types.SimpleNamespace(
        is_available=lambda: True, current_device=lambda: 0, get_device_name=lambda i: "torch's name"
    )
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    h100 = "NVIDIA H100 80GB HBM3"
    assert [mfu.device_name(d) for d in (None, "cuda", "cuda:0", "cpu", "meta")] == [h100, h100, h100, None, None]
    cuda.is_available = lambda: False
    assert mfu.device_name() is None and mfu.device_name("cuda:0") is None


def test_tflops_and_mfu_from_a_ranks_file_to_the_exporter_and_kit_ps(tmp_path, monkeypatch):
    from kit.jobdir import JobDir, trained, write_rank_metrics
    from kit.monitor.training import TrainingSource
    from kit.train import progress

    metrics = tmp_path / "job" / JobDir.METRICS / "node1"
    write_rank_metrics(metrics, 0, {"step": 5, "last_step_timestamp_seconds": 1.0, "tflops": 412.0, "mfu": 0.4164})
    write_rank_metrics(metrics, 1, {"step": 5, "last_step_timestamp_seconds": 1.0, "tflops": 0.002})
    served = {(s.spec.name, s.labels["rank"]): s.value for s in TrainingSource(metrics).poll().samples}
    assert served[("training_tflops", "0")] == 412.0 and served[("training_mfu", "0")] == 0.4164
    assert ("training_mfu", "1") not in served and served[("training_tflops", "1")] == 0.002
    p = trained.training_progress(tmp_path / "job")
    assert (p.tflops, p.mfu) == (412.0, 0.4164) and "412 TFLOP/s/device, MFU 42%" in trained.progress_words(p)
    assert "MFU n/a" in " ".join(trained.progress_words(trained.Progress(tflops=0.002)))
    # Any script: progress.step(n, flops=...) — on this CPU, TFLOP/s and no MFU.
    monkeypatch.setenv("KIT_METRICS_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(progress, "_METRICS", {"samples_total": 0.0, "written_at": 0.0, "written_samples": 0.0})
    monkeypatch.setattr(progress, "METRICS_INTERVAL", 0.0)
    for n in range(1, 4):
        progress.step(n, flops=1e9, precision="fp32")
    written = json.loads((tmp_path / "mine" / JobDir.RANK_METRICS.format(rank=0)).read_text())
    assert written["tflops"] > 0 and "mfu" not in written


def test_the_gpt_trains_compiled_with_its_checkpoint_keys_unchanged(tmp_path):
    """`--compile`: torch.compile makes the GPT's forward (dynamo says how many graphs), it learns as eager does,
    and its checkpoint's keys are the eager model's (compiled in place: a checkpoint resumes either way)."""
    import os
    import re
    import subprocess
    import sys

    import torch

    from kit.train.gpt import GPT

    args = [
        "--model",
        "gpt",
        "--layers",
        "1",
        "--max-steps",
        "30",
        "--batch-size",
        "8",
        "--checkpoint-every",
        "30",
        "--no-snapshots",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "kit.train", *args, "--compile", "--checkpoint-dir", str(tmp_path)],
        env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")},  # its cache: the test's own
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    graphs = int(re.search(r"torch.compile: (\d+) graph\(s\) compiled", proc.stdout).group(1))
    first, last = map(float, re.search(r"first_loss=([0-9.]+) last_loss=([0-9.]+)", proc.stdout).groups())
    assert graphs >= 1 and last < first / 2, proc.stdout
    saved = torch.load(tmp_path / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    assert sorted(saved) == sorted(GPT(layers=1).state_dict())
