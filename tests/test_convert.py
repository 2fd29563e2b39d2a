"""`kit convert` on the seed documents' sbatch scripts (issue 19 finding 13): the job file
it prints is accepted by `kit launch -f` as is, carries what kit has fields for, and lists
plainly everything else (never dropped silently)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from helpers import kit

DATA = Path(__file__).parent / "data" / "sbatch"

EXPECTED = {
    "train_ddp.sbatch": ({"job_name": "ddp-training", "nodes": 2, "gpus_per_node": 1, "ntasks_per_node": 1,
                          "cpus_per_task": 28, "mem": "200G", "time": "24:00:00",
                          "command": ["python", "train_ddp.py"]},
                         ["#SBATCH --output=train_%j.out: kit writes the logs", "export RANK=$SLURM_PROCID: kit sets RANK",
                          "export MASTER_ADDR=$(scontrol show hostnames"]),
    "torch_launch.sbatch": ({"nodes": 2, "gpus_per_node": 1, "ntasks_per_node": 1,
                             "command": ["python", "-m", "torch.distributed.launch", "--nproc_per_node=1",
                                         "train_ddp.py"]},
                            ["--node_rank=$SLURM_NODEID: kit exports PET_NNODES"]),
    "deepspeed.sbatch": ({"job_name": "deepspeed-zero3", "env": {"NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "^docker,lo",
                                                                 "GLOO_SOCKET_IFNAME": "eth0"},
                          "command": ["python", "train.py", "--deepspeed", "--deepspeed_config",
                                      "ds_zero3_offload.json"]},
                         ["conda activate research: setup", "export WORLD_SIZE=$SLURM_NTASKS: kit sets WORLD_SIZE"]),
    "sloughgpt.sbatch": ({"nodes": 4, "ntasks_per_node": 8, "gpus_per_node": 8, "partition": "gpu",
                          "command": ["bash", "-c", "python -m sloughgpt.distributed_training --world-size 32 "
                                                    "--master-addr $MASTER_ADDR --master-port $MASTER_PORT"]},
                         ["srun --ntasks-per-node=8 --nodes=4: kit runs its own srun"]),
    "array_lr.sbatch": ({"array": "0-9", "command": ["bash", "-c", "python train.py --lr $LR --batch_size $BATCH_SIZE"]},
                        ["LR=$(echo", "a shell variable the script sets"]),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_convert_carries_what_kit_has_and_lists_the_rest(tmp_path, name):
    fields, listed = EXPECTED[name]
    proc = kit("convert", str(DATA / name))
    assert proc.returncode == 0, proc.stderr
    job = tomllib.loads(proc.stdout)
    assert {k: job.get(k) for k in fields} == fields, proc.stdout
    not_carried = [line.removeprefix("kit: not carried over: ") for line in proc.stderr.splitlines()]
    assert all(line.startswith("kit: not carried over: ") for line in proc.stderr.splitlines()), proc.stderr
    for piece in listed:
        assert any(piece in line for line in not_carried), (piece, proc.stderr)
        assert f"#   " in proc.stdout and piece.split(":")[0] in proc.stdout  # the same list, in the file
    # The printed job file is one kit launch accepts as it is.
    (tmp_path / "job.toml").write_text(proc.stdout)
    dry = kit("launch", "--dry-run", "-f", str(tmp_path / "job.toml"), "--output-dir", str(tmp_path / "jobs"))
    assert dry.returncode == 0, dry.stderr


def test_convert_of_a_missing_or_unreadable_script_is_one_line(tmp_path):
    proc = kit("convert", str(tmp_path / "nope.sbatch"))
    assert (proc.returncode, proc.stderr.splitlines()[0]) == (2, f"kit: SCRIPT: no such script: {tmp_path}/nope.sbatch")
    (tmp_path / "fifo").symlink_to("/dev/zero")
    proc = kit("convert", str(tmp_path / "fifo"), timeout=30)
    assert proc.returncode == 2 and proc.stderr.startswith("kit: SCRIPT: cannot read ") and "Traceback" not in proc.stderr
