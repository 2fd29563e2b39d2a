"""A check for real GPUs: what kit promises about GPUs, on the machine at hand, without Slurm.

    python bench/gpu_check.py [--steps 200] [--exporter-only] [--quick] [--cpu-path]

1. `kit exporter` against the driver: every GPU family it serves has a value for every GPU
   NVML shows, and `promtool check metrics` finds nothing (when promtool is installed).
2. The reference trainer on CUDA (bf16 where the GPU supports it), one rank per GPU with
   NCCL, each rank started through a generated `launcher.sh` with the variables srun would
   give it set by hand; the exporter's utilisation while it trains.
3. The launcher's teardown: after the ranks end, no process of theirs is left.
4. Preflight: what `kit launch --preflight` checks on this node — NVML's health, and the
   bf16 8192^3 matrix product per GPU against its datasheet peak (the burn-in figures it judges by).
5. MFU: one rank of the reference trainer with a model large enough to load the GPU;
   the TFLOP/s and MFU its metrics file reports, against step 4's bare bf16 matrix product's TFLOP/s
   measured here (a rate above the matrix product's is a wrong FLOP count) and NVML's name
   matched in kit's peak table; then its GPT at 0.9 B parameters (`--model gpt`, batches made on
   the GPU), eager and with `--compile`, whose MFU should be 0.45 or more.
6. The exporter's cost: in one training process the GPT steps on while the exporter runs
   and is stopped in turn; the median step with it over the median without (target <= 1 %).

Without an NVIDIA GPU (no driver, or NVML sees none) it says so and exits 0. With GPUs that
NVML sees but torch does not, it says so and exits 1 (--exporter-only: step 1 alone).
--quick: fewer steps (the test suite's run). --cpu-path: step 2 and 3's machinery with 2 CPU ranks
and step 6's with a tiny GPT on the CPU (the suite runs it, so the GPU run's path does not rot where
no GPU is).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from common import free_port, scrape, start_exporter  # noqa: E402

GPU_FAMILIES = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    "DCGM_FI_DEV_XID_ERRORS",
    "gpu_compute_processes",
    "gpu_lost",
    "gpu_xid_errors_total",
)
OPTIONAL = (
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
)  # not on every GPU


def nvml_gpus() -> tuple[int, str]:
    """(GPUs NVML sees, driver version or why none)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
            return pynvml.nvmlDeviceGetCount(), version.decode() if isinstance(version, bytes) else str(version)
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:  # no library, no driver
        return 0, f"{type(e).__name__}: {e}"


def values(text: str, family: str) -> list[float]:
    return [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(family + "{") or line.startswith(family + " ")
    ]


def check_exporter(gpus: int, tmp: Path) -> tuple[bool, list[str]]:
    port = free_port()
    proc = start_exporter(port, tmp / "exporter.log")
    lines = []
    try:
        text = scrape(port)
    except OSError as e:
        proc.kill()
        return False, [f"exporter: no answer ({e}); log: {(tmp / 'exporter.log').read_text()[-500:]}"]
    finally:
        proc.terminate()
        proc.wait(10)
    ok = True
    for family in GPU_FAMILIES + OPTIONAL:
        got = values(text, family)
        if family in OPTIONAL and not got:
            lines.append(f"  {family:<44} not supported on these GPUs")
            continue
        good = len(got) == gpus or family in OPTIONAL  # optional: not supported on every GPU model
        ok &= good
        note = "" if len(got) == gpus else "  (not supported on the others)" if good else "  <- MISSING"
        lines.append(f"  {family:<44} {len(got)}/{gpus} GPUs{note}  {', '.join(f'{v:g}' for v in got[:8])}")
    if 'kit_exporter_collector_success{collector="gpu"} 1.0' not in text:
        ok = False
        lines.append('  kit_exporter_collector_success{collector="gpu"} is not 1')
    if shutil.which("promtool"):
        check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        findings = (check.stdout + check.stderr).strip()
        ok &= check.returncode == 0 and not findings
        lines.append(f"  promtool check metrics: {findings or 'clean'}")
    else:
        lines.append("  promtool check metrics: promtool not installed (apt-get install prometheus)")
    return ok, lines


def rank_metrics(job_dir: Path) -> list[dict]:
    """Every rank's last metrics file (``metrics/<node>/rank-<R>.json``)."""
    from kit import jobdir

    return [
        m
        for f in sorted(job_dir.glob("metrics/*/rank-*.json"))
        if (m := jobdir.read_rank_metrics(f.read_text())) is not None
    ]


def run_trainer(
    gpus: int, steps: int, tmp: Path, cpu: bool = False, model: tuple[str, ...] = ()
) -> tuple[bool, list[str], Path]:
    """``gpus`` ranks of the reference trainer through launcher.sh (``cpu``: on CPU with gloo,
    to check this path where no GPU is; ``model``: the trainer's size arguments). Returns the
    job directory too."""
    import torch

    from kit import submission
    from kit.core import spec as specs

    precision = "32-true" if cpu else "bf16-mixed" if torch.cuda.is_bf16_supported() else "16-mixed"
    # On CPU the machinery is what is checked (launcher, ranks, teardown): a small model will do.
    model = model or (("--batch-size", "32", "--hidden", "64") if cpu else ("--batch-size", "256", "--hidden", "1024"))
    job = submission.resolve(
        specs.JobSpec(
            command=[
                sys.executable,
                "-m",
                "kit.train",
                "--max-steps",
                str(steps),
                *model,
                "--precision",
                precision,
                "--checkpoint-every",
                "0",
            ],
            output_dir=str(tmp / "jobs"),
            ntasks_per_node=gpus,
            exporter=False,
            code_snapshot=False,
        ),
        cwd=tmp,
    )
    job_dir = submission.prepare(job).job_dir
    (job_dir / "progress" / "r0").mkdir(parents=True)
    port = free_port()
    exporter = start_exporter(free_port(), tmp / "exporter-train.log", gpus=not cpu)
    eport = int(exporter.args[exporter.args.index("--port") + 1])
    procs = []
    t0 = time.perf_counter()
    for rank in range(gpus):
        env = {
            **os.environ,
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank),
            "SLURM_NTASKS": str(gpus),
            "SLURM_NTASKS_PER_NODE": str(gpus),
            "SLURM_NODEID": "0",
            "SLURM_NNODES": "1",
            "SLURM_JOB_ID": "1",
            "SLURM_STEP_ID": "0",
            "SLURM_JOB_NAME": "gpu-check",
            "SLURMD_NODENAME": socket.gethostname(),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "KIT_JOB_DIR": str(job_dir),
            "KIT_LOG_DIR": str(job_dir / "logs"),
            "KIT_PROGRESS_DIR": str(job_dir / "progress" / "r0"),
            "KIT_HANG_DIR": str(job_dir / "hang" / "r0"),
            "KIT_RESTART": "0",
        }
        procs.append(
            subprocess.Popen(
                ["bash", str(job_dir / "launcher.sh")],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    util: list[float] = []
    while any(p.poll() is None for p in procs):
        try:
            util += [v for v in values(scrape(eport), "DCGM_FI_DEV_GPU_UTIL")]
        except OSError:
            pass
        time.sleep(0.5)
    seconds = time.perf_counter() - t0
    exporter.terminate()
    exporter.wait(10)
    outputs = [p.stdout.read() for p in procs]
    codes = [p.returncode for p in procs]
    lines = [
        f"  {gpus} ranks, {'gloo' if cpu else 'NCCL'}, {precision}: exit codes {codes}, {seconds:.1f} s for "
        f"{steps} steps"
    ]
    done = f"done at step={steps}" in outputs[0]  # the trainer reports on rank 0
    lines.append(f"  rank 0 reached step {steps}: {'yes' if done else 'NO'}")
    if util:
        lines.append(
            f"  GPU utilisation seen by the exporter while training: max {max(util):.0f} %, "
            f"mean {sum(util) / len(util):.0f} %"
        )
    backend = [line for line in outputs[0].splitlines() if "backend=" in line][:1]
    lines += [f"  rank 0: {b.strip()}" for b in backend]
    # Teardown: no process of the launchers is left.
    time.sleep(1)
    left = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if str(job_dir).encode() in Path(f"/proc/{pid}/cmdline").read_bytes() and int(pid) != os.getpid():
                    left.append(pid)
            except OSError:
                pass
    lines.append(f"  processes left after the ranks ended: {len(left)}")
    lines += [f"  rank 0: {f.strip()}" for f in outputs[0].splitlines() if "FLOPs per step" in f][:1]
    metrics = rank_metrics(job_dir)
    lines.append(
        "  metrics files: "
        + "; ".join(
            f"rank {i}: {m.get('tflops', 'no')} TFLOP/s, MFU {m.get('mfu', 'n/a')}" for i, m in enumerate(metrics)
        )
    )
    ok = codes == [0] * gpus and done and not left and len(metrics) == gpus
    if not ok:
        lines.append("  rank 0's output (end):\n" + outputs[0][-2000:])
    return ok, lines, job_dir


def preflight(tmp: Path) -> tuple[bool, list[str], float]:
    """Step 4: what `kit launch --preflight` checks on this node (kit.preflight: NVML's health, the bf16 matmul
    burn-in per GPU against its peak); (ok, lines, GPU 0's burn-in TFLOP/s: the bare matrix product's rate)."""
    from kit.preflight import health, verdict

    record = verdict.check_node("this node", burn_seconds=4.0, say=lambda line: None)
    lines = [f"  {health.Finding(**f).line()}" for f in record["findings"]]
    gpus = record["burn"].get("gpus", [])
    for g in gpus:
        share = "n/a" if g["of_peak"] is None else f"{100 * g['of_peak']:.0f} % of its peak"
        lines.append(f"  GPU {g['index']} ({g['name']}): bf16 8192^3 matmul {g['tflops']:.0f} TFLOP/s, {share}")
    lines.append(f"  preflight: {'ok' if record['ok'] else 'FAILED'} in {record['seconds']:.1f} s")
    return record["ok"] and bool(gpus), lines, gpus[0]["tflops"] if gpus else 0.0


def check_mfu(tmp: Path, bare: float) -> tuple[bool, list[str]]:
    """Step 5: one rank with a model that loads the GPU; its TFLOP/s and MFU are sane (``bare``: a bf16 8192^3
    matrix product's TFLOP/s on GPU 0, step 4's)."""
    import torch

    from kit.monitor import peaks

    name = torch.cuda.get_device_name(0)
    os.makedirs(tmp / "mfu", exist_ok=True)
    model = ("--features", "4096", "--hidden", "16384", "--batch-size", "4096", "--samples", "65536")
    trained, lines, job_dir = run_trainer(1, 600, tmp / "mfu", model=model)
    metrics = rank_metrics(job_dir)
    tflops = float(metrics[0].get("tflops", 0)) if metrics else 0.0
    mfu = metrics[0].get("mfu") if metrics else None
    peak = peaks.peak_tflops(name, "bf16-mixed")
    lines.append(
        f"  {name}: kit's peak table says {peak} TFLOP/s bf16 dense; a bare bf16 8192^3 matrix product "
        f"here: {bare:.0f} TFLOP/s ({bare / peak:.2f} of the peak)"
        if peak
        else f"  {name}: not in kit's peak table (MFU n/a); bare bf16 matrix product {bare:.0f} TFLOP/s"
    )
    lines.append(
        f"  the trainer's rate: {tflops:.1f} TFLOP/s, MFU {mfu}; {tflops / bare:.2f} of the bare matrix product's rate"
    )
    sane = 0 < tflops <= bare * 1.05 and (mfu is None if peak is None else 0 < float(mfu) < 1)
    if not sane:
        lines.append("  <- a rate above the bare matrix product's, or an MFU outside (0, 1): a wrong FLOP count")
    gpt_ok = True
    for compiled in (False, True):
        ok, gpt_lines = check_gpt(tmp, bare, compiled)
        lines += gpt_lines
        gpt_ok = gpt_ok and ok
    return trained and sane and gpt_ok, lines


# The GPT: 0.9 B parameters (12·16·2048² in its blocks), batches made on the GPU, bf16.
GPT = ("--model", "gpt", "--d-model", "2048", "--layers", "16", "--heads", "16", "--seq-len", "2048")
GPT += ("--vocab", "50304", "--batch-size", "8")


def check_gpt(tmp: Path, bare: float, compiled: bool) -> tuple[bool, list[str]]:
    """The GPT at 0.9 B, eager or ``compiled`` (``--compile``): its TFLOP/s and MFU (its target: >= 0.45), and a
    rate no higher than the bare matrix product's."""
    how = "compiled" if compiled else "eager"
    trained, lines, job_dir = run_trainer(
        1, 120 if compiled else 80, tmp / f"gpt-{how}", model=GPT + ("--compile",) * compiled
    )
    metrics = rank_metrics(job_dir)
    tflops = float(metrics[0].get("tflops", 0)) if metrics else 0.0
    mfu = metrics[0].get("mfu") if metrics else None
    lines.append(
        f"  the GPT (0.9 B, {how}, bf16): {tflops:.1f} TFLOP/s, MFU {mfu} (target: >= 0.45); "
        f"{tflops / bare:.2f} of the bare matrix product's rate"
    )
    sane = 0 < tflops <= bare * 1.05
    if not sane:
        lines.append("  <- the GPT's rate is above the bare matrix product's, or none: a wrong FLOP count")
    return trained and sane, lines


def cpu_path(steps: int) -> int:
    """--cpu-path: step 2's machinery with 2 CPU ranks, and steps 6 and 7's with a tiny GPT on the CPU."""
    import gpu_costs

    with tempfile.TemporaryDirectory(prefix="kit-gpu-check-") as tmp:
        ok, lines, _ = run_trainer(2, steps, Path(tmp), cpu=True)
        print("trainer path on CPU (2 ranks, gloo): " + ("ok" if ok else "FAILED"))
        print("\n".join(lines))
        for name, (measured, lines) in (
            ("the exporter's cost", gpu_costs.exporter_cost(Path(tmp), seconds=4.0, window=1.0, small=True)),
            ("the straggler measurement's cost", gpu_costs.straggler_cost(seconds=4.0, window=1.0, small=True)),
        ):
            print(f"{name}, a tiny GPT on the CPU: " + ("measured" if measured else "FAILED"))
            print("\n".join(lines))
            ok = ok and measured
    return 0 if ok else 1


def on_gpus(gpus: int, steps: int, only: set[int], tmp: Path) -> dict[str, bool]:
    """Steps 2 to 7 (those in ``only``, where it names any) on CUDA; what passed."""
    import gpu_costs
    import torch

    names = {torch.cuda.get_device_name(i) for i in range(gpus)}
    print(
        f"2. reference trainer on CUDA ({', '.join(sorted(names))}), torch {torch.__version__}, "
        f"CUDA {torch.version.cuda}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}"
    )
    passed, bare = {}, 0.0
    steps_run = [
        (2, "trainer_ok", None, lambda: run_trainer(gpus, steps, tmp)[:2]),
        (4, "preflight_ok", "4. preflight (NVML health, burn-in)", lambda: preflight(tmp)),
        (5, "mfu_ok", "5. MFU of the reference trainer", lambda: check_mfu(tmp, bare)),
        (6, "exporter_cost_ok", "6. the exporter's cost to a training step", lambda: gpu_costs.exporter_cost(tmp)),
        (7, "straggler_cost_ok", "7. the straggler measurement's cost", lambda: gpu_costs.straggler_cost()),
    ]
    for number, key, title, run in steps_run:
        if only and number not in only and not (number == 4 and 5 in only):  # step 5 measures against step 4's
            continue
        result = run()
        if number == 4:
            bare = result[2]
        passed[key] = result[0]
        if title:
            print(f"{title}: " + ("ok" if result[0] else "FAILED"))
        print("\n".join(result[1]))
    return passed


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--exporter-only", action="store_true", help="check the exporter only (no training)")
    ap.add_argument("--quick", action="store_true", help="fewer steps (the test suite's run)")
    ap.add_argument(
        "--cpu-path",
        action="store_true",
        help="where no GPU is: run step 2's path (launcher.sh by hand, teardown) with 2 CPU ranks",
    )
    ap.add_argument("--only", default="", metavar="N[,N]", help="run these of steps 2-7 alone (step 1 always)")
    args = ap.parse_args()
    if args.quick:
        args.steps = 20
    if args.cpu_path:
        return cpu_path(args.steps)
    only = {int(n) for n in args.only.split(",") if n}
    gpus, driver = nvml_gpus()
    if not gpus:
        print(f"no GPU: NVML sees none here ({driver}); nothing to check")
        return 0
    print(f"NVML: {gpus} GPU(s), driver {driver}")
    with tempfile.TemporaryDirectory(prefix="kit-gpu-check-") as tmp:
        tmp = Path(tmp)
        ok, lines = check_exporter(gpus, tmp)
        print("1. kit exporter on the driver: " + ("ok" if ok else "FAILED"))
        print("\n".join(lines))
        if args.exporter_only:
            return 0 if ok else 1
        import torch

        if not torch.cuda.is_available() or torch.cuda.device_count() != gpus:
            print(
                f"2. trainer: torch {torch.__version__} sees {torch.cuda.device_count()} CUDA device(s), NVML {gpus}: "
                "not run (a CUDA build of torch 2.13.0 is needed)"
            )
            return 1
        passed = {"exporter_ok": ok, **on_gpus(gpus, args.steps, only, tmp)}
    print("result: " + ("every check passed" if all(passed.values()) else "FAILED"))
    print(json.dumps({"gpus": gpus, "driver": driver, **passed}))
    return 0 if all(passed.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
