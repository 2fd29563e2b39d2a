"""`kit convert` on the seed documents' sbatch scripts: the job file
it prints is accepted by `kit launch -f` as is, carries what kit has fields for, and lists
plainly everything else (never dropped silently)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import tomllib
from helpers import kit

from kit import slurm

DATA = Path(__file__).parent / "data" / "sbatch"

EXPECTED = {
    "train_ddp.sbatch": (
        {
            "job_name": "ddp-training",
            "nodes": 2,
            "gpus_per_node": 1,
            "ntasks_per_node": 1,
            "cpus_per_task": 28,
            "mem": "200G",
            "time": "24:00:00",
            "command": ["python", "train_ddp.py"],
        },
        [
            "#SBATCH --output=train_%j.out: kit writes the logs",
            "export RANK=$SLURM_PROCID: kit sets RANK",
            "export MASTER_ADDR=$(scontrol show hostnames",
        ],
    ),
    "torch_launch.sbatch": (
        {
            "nodes": 2,
            "gpus_per_node": 1,
            "ntasks_per_node": 1,
            "command": ["python", "-m", "torch.distributed.launch", "--nproc_per_node=1", "train_ddp.py"],
        },
        ["--node_rank=$SLURM_NODEID: kit exports PET_NNODES"],
    ),
    "deepspeed.sbatch": (
        {
            "job_name": "deepspeed-zero3",
            "env": {"NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "^docker,lo", "GLOO_SOCKET_IFNAME": "eth0"},
            "command": ["python", "train.py", "--deepspeed", "--deepspeed_config", "ds_zero3_offload.json"],
        },
        ["conda activate research: setup", "export WORLD_SIZE=$SLURM_NTASKS: kit sets WORLD_SIZE"],
    ),
    "sloughgpt.sbatch": (
        {
            "nodes": 4,
            "ntasks_per_node": 8,
            "gpus_per_node": 8,
            "partition": "gpu",
            "command": [
                "bash",
                "-c",
                "python -m sloughgpt.distributed_training --world-size 32 "
                "--master-addr $MASTER_ADDR --master-port $MASTER_PORT",
            ],
        },
        ["srun --ntasks-per-node=8 --nodes=4: kit runs its own srun"],
    ),
    "array_lr.sbatch": (
        {
            "array": "0-9",
            "command": [
                "bash",
                "-c",
                "LR=$(echo \"0.001 0.0001 0.00001 0.000001\" | cut -d' ' -f$((SLURM_ARRAY_TASK_ID % 4 + 1)))\n"
                "BATCH_SIZE=$((32 * (SLURM_ARRAY_TASK_ID / 4 + 1)))\n"
                "python train.py --lr $LR --batch_size $BATCH_SIZE",
            ],
        },
        ["BATCH_SIZE, LR: set by the script, carried into the command"],
    ),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_convert_carries_what_kit_has_and_lists_the_rest(tmp_path, name):
    fields, listed = EXPECTED[name]
    proc = kit("convert", str(DATA / name))
    assert proc.returncode == 0, proc.stderr
    job = tomllib.loads(proc.stdout)
    assert {k: job.get(k) for k in fields} == fields, proc.stdout
    said = proc.stderr.splitlines()
    assert all(line.startswith(("kit: not carried over: ", "kit: changed: ")) for line in said), proc.stderr
    for piece in listed:
        assert any(piece in line for line in said), (piece, proc.stderr)
        assert "#   " in proc.stdout and piece.split(":")[0] in proc.stdout  # the same list, in the file
    # The printed job file is one kit launch accepts as it is.
    (tmp_path / "job.toml").write_text(proc.stdout)
    dry = kit("launch", "--dry-run", "-f", str(tmp_path / "job.toml"), "--output-dir", str(tmp_path / "jobs"))
    assert dry.returncode == 0, dry.stderr


def test_convert_of_a_missing_or_unreadable_script_is_one_line(tmp_path):
    proc = kit("convert", str(tmp_path / "nope.sbatch"))
    assert (proc.returncode, proc.stderr.splitlines()[0]) == (2, f"kit: SCRIPT: no such script: {tmp_path}/nope.sbatch")
    (tmp_path / "fifo").symlink_to("/dev/zero")
    proc = kit("convert", str(tmp_path / "fifo"), timeout=30)
    assert (
        proc.returncode == 2 and proc.stderr.startswith("kit: SCRIPT: cannot read ") and "Traceback" not in proc.stderr
    )


@pytest.mark.parametrize(
    "line, said",
    [
        ("sbatch --wrap 'python3 train.py'", "the file runs sbatch without a batch script kit convert can read"),
        ("sbatch -N 2 missing.sh", "the file runs sbatch on missing.sh, which cannot be read: No such file"),
        ("sbatch a.sh\nsbatch b.sh", "the file runs sbatch 2 times: kit convert takes one job"),
    ],
)
def test_a_file_that_runs_sbatch_kit_cannot_follow_is_refused_with_the_options_form(tmp_path, line, said):
    """A file holding an `sbatch …` line converts the script it submits; one kit cannot follow is refused (before:
    a job file whose command ran sbatch), pointing at `kit convert SCRIPT -- SBATCH-OPTIONS`."""
    (tmp_path / "submit.sh").write_text(f"#!/bin/bash\n{line}\n")
    proc = kit("convert", "submit.sh", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.startswith(f"kit: SCRIPT: {said}"), proc.stderr
    assert "kit convert SCRIPT -- SBATCH-OPTIONS" in proc.stderr.splitlines()[-1], proc.stderr


# srun lines with shell syntax. Each runs as the script runs it and as the
# job file kit convert wrote runs it; the outputs (and the files the line writes) are the same.
SHELL_LINES = {
    "substitution": """srun --ntasks-per-node=1 python3 -c 'import sys; print("args", sys.argv[1:])' """
    """--lr=$(python3 -c 'print(0.1)') | tee log.txt""",
    "backticks": """srun echo "uid `id -u` here" && echo second""",
    "redirections": """srun python3 -c 'print("to file")' > out.log 2>&1 && echo done | tee x; cat out.log""",
    "semicolons": """srun bash -c 'echo $((1 + 2))'; echo after; (echo sub)""",
    "no dollar": """srun printf '%s\\n' one two > listed.txt && wc -l < listed.txt""",
}
FAKE_SRUN = 'srun() { while [[ "$1" == -* ]]; do shift; done; "$@"; }\n'


def _outputs(cwd: Path) -> dict:
    return {p.name: p.read_text() for p in sorted(cwd.iterdir()) if p.is_file() and p.suffix != ".sbatch"}


@pytest.mark.parametrize("name", sorted(SHELL_LINES))
def test_a_command_with_shell_syntax_runs_as_the_script_runs_it(tmp_path, name):
    script = tmp_path / "job.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH --nodes=1\n{SHELL_LINES[name]}\n")
    proc = kit("convert", str(script))
    assert proc.returncode == 0 and "shell syntax" in proc.stderr, proc.stderr
    command = tomllib.loads(proc.stdout)["command"]
    assert command[:2] == ["bash", "-c"], command
    by_script, by_kit = tmp_path / "script", tmp_path / "kit"
    by_script.mkdir()
    by_kit.mkdir()
    a = subprocess.run(["bash", "-c", FAKE_SRUN + f"source {script}"], cwd=by_script, capture_output=True, text=True)
    b = subprocess.run(command, cwd=by_kit, capture_output=True, text=True)
    assert (a.returncode, a.stdout) == (b.returncode, b.stdout) and a.stdout, (a.stdout, b.stdout, b.stderr)
    assert _outputs(by_script) == _outputs(by_kit)
    (tmp_path / "job.toml").write_text(proc.stdout)
    dry = kit("launch", "--dry-run", "-f", str(tmp_path / "job.toml"), "--output-dir", str(tmp_path / "jobs"))
    assert dry.returncode == 0, dry.stderr


def test_a_converted_shell_line_runs_on_the_cluster(cluster, tmp_path):
    script = tmp_path / "job.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH --nodes=1\n{SHELL_LINES['substitution']}\n")
    (tmp_path / "job.toml").write_text(kit("convert", str(script)).stdout)
    proc = kit(
        "launch",
        "--local",
        "--wait",
        "--no-exporter",
        "-f",
        str(tmp_path / "job.toml"),
        "--output-dir",
        str(tmp_path / "jobs"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    job_dir = Path(proc.stdout.split("job dir: ")[1].splitlines()[0].strip())
    assert "args ['--lr=0.1']" in (job_dir / "logs" / "rank-0.r0.log").read_text()


def test_convert_output_is_printable_and_reads_back(tmp_path):
    """A not-carried line with control characters is escaped (in the file and on the
    terminal); a character above U+FFFF is a valid TOML escape; `$(...)` in an #SBATCH line is
    listed as that line, nothing of it carried."""
    script = tmp_path / "job.sbatch"
    script.write_bytes(
        "#!/bin/bash\n#SBATCH --job-name=$(touch /x/y)\n#SBATCH --nodes=2\necho 'bell\x07 esc\x1b[31m'\n"
        "srun python3 -c 'print(1)' --tag '\U000e0001'\n".encode()
    )
    proc = kit("convert", str(script))
    assert proc.returncode == 0, proc.stderr
    assert "\x07" not in proc.stdout + proc.stderr and "\x1b" not in proc.stdout + proc.stderr
    assert "bell\\x07 esc\\x1b[31m" in proc.stderr
    job = tomllib.loads(proc.stdout)
    assert job["command"][-1] == "\U000e0001" and job["nodes"] == 2 and "job_name" not in job, proc.stdout
    assert "#SBATCH --job-name=$(touch /x/y): '/x/y)' is not an option" in proc.stderr, proc.stderr
    (tmp_path / "job.toml").write_text(proc.stdout)
    dry = kit("launch", "--dry-run", "-f", str(tmp_path / "job.toml"), "--output-dir", str(tmp_path / "jobs"))
    assert dry.returncode == 0, dry.stderr


def test_an_array_script_converts_into_a_job_that_runs_as_the_script(cluster, tmp_path):
    """The seed's array script sets LR and BATCH_SIZE from the task id, then
    runs `python train.py --lr $LR ...`; the job file carries the assignments, and each task of
    the converted job prints what the script prints by hand for that task id."""
    text = (DATA / "array_lr.sbatch").read_text().replace("--array=0-9", "--array=0-4").replace("--gres=gpu:1", "")
    (tmp_path / "job.sbatch").write_text(text.replace("python train.py", "python3 train.py"))
    (tmp_path / "train.py").write_text("import sys\nprint('train', *sys.argv[1:])\n")
    proc = kit("convert", str(tmp_path / "job.sbatch"))
    (tmp_path / "job.toml").write_text(proc.stdout)
    by_hand = {
        i: subprocess.run(
            ["bash", str(tmp_path / "job.sbatch")],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env={**__import__("os").environ, "SLURM_ARRAY_TASK_ID": str(i)},
        ).stdout
        for i in range(5)
    }
    assert by_hand[4] == "train --lr 0.001 --batch_size 64\n", by_hand
    run = kit(
        "launch",
        "--local",
        "--wait",
        "--no-exporter",
        "--no-code-snapshot",
        "-f",
        str(tmp_path / "job.toml"),
        "--output-dir",
        str(tmp_path / "jobs"),
        cwd=tmp_path,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    job_dir = Path(run.stdout.split("job dir: ")[1].splitlines()[0].strip())
    for i in range(5):
        assert (job_dir / "tasks" / str(i) / "logs" / "rank-0.r0.log").read_text() == by_hand[i]


def test_a_container_image_on_the_batch_script_is_carried_to_the_step_and_said(tmp_path):
    """`#SBATCH --container-image=…` would run the batch script in the image
    (where srun does not exist); kit convert carries it as image (the srun step's) and says so."""
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --container-image=/images/pt.sqsh\nsrun python3 train.py\n")
    proc = kit("convert", str(script))
    assert tomllib.loads(proc.stdout)["image"] == "/images/pt.sqsh"
    assert "#SBATCH --container-image=/images/pt.sqsh: carried as image: kit puts it on the srun step" in proc.stderr


def test_the_sbatch_command_lines_options_count_over_the_scripts(tmp_path):
    """Seed 002 gives nodes, GPUs and pyxis's flags on sbatch's command line, not in #SBATCH lines:
    `kit convert SCRIPT -- SBATCH-OPTIONS` reads them (over the script's own, as sbatch does), pyxis's
    flags as kit's container fields, a mount with what a relative path in the code view means; and a
    `python` command in an image with python3 alone runs python3."""
    root = tmp_path / "root" / "usr" / "bin"
    root.mkdir(parents=True)
    for tool in ("bash", "tee", "python3"):
        (root / tool).write_text("")
    image = tmp_path / "py3.sqsh"
    subprocess.run(["mksquashfs", str(tmp_path / "root"), str(image), "-quiet", "-no-progress"], check=True)
    script = tmp_path / "prelaunch.sh"
    script.write_text("#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --time=30\nsrun python train.py\n")
    proc = kit(
        "convert",
        str(script),
        "--",
        "--nodes=4",
        "--gpus-per-node=8",
        "--ntasks-per-node=8",
        f"--container-image={image}",
        "--no-container-mount-home",
        "--container-remap-root",
        "--container-workdir=/w/lit-gpt",
        "--container-mounts=/w/lit-gpt:/w/lit-gpt,/w/data:/w/lit-gpt/data",
    )
    assert proc.returncode == 0, proc.stderr
    job = tomllib.loads(proc.stdout)
    assert (job["nodes"], job["gpus_per_node"], job["ntasks_per_node"], job["time"]) == (4, 8, 8, "30")
    assert (job["image"], job["container_workdir"], job["container_mount_home"], job["container_remap_root"]) == (
        str(image),
        "/w/lit-gpt",
        False,
        True,
    )
    assert job["mounts"] == ["/w/lit-gpt:/w/lit-gpt", "/w/data:/w/lit-gpt/data"] and "sbatch_args" not in job
    assert job["command"] == ["python3", "train.py"], job
    assert f"kit: changed: python: {image} has python3 alone: the command runs python3" in proc.stderr
    assert "a relative path such as data/ is the work tree's own" in proc.stderr
    stray = kit("convert", str(script), "--", "--nodes=2", "./prelaunch.sh")
    assert "sbatch ./prelaunch.sh: not an option" in stray.stderr and tomllib.loads(stray.stdout)["nodes"] == 2


def test_a_script_setting_its_parameters_converts_into_the_same_command(tmp_path):
    """Seed 003's shape: parameters set as shell variables, then used by the
    srun line. The job file's command prints what the script prints."""
    script = tmp_path / "run_distributed.slurm"
    script.write_text(
        "#!/bin/bash\n#SBATCH --nodes=1\nEPOCHS=2\nBATCH_SIZE=64           # Per-GPU batch size\n"
        'LEARNING_RATE=0.01\nDATA_DIR="./data dir"\nCHECKPOINT_DIR="./checkpoints"\nUNUSED=$(false)\n'
        "srun python3 -c 'import sys; print(sys.argv[1:])' --epochs $EPOCHS --batch-size $BATCH_SIZE "
        '--lr $LEARNING_RATE --data-dir "$DATA_DIR" --checkpoint-dir $CHECKPOINT_DIR\n'
    )
    proc = kit("convert", str(script))
    assert proc.returncode == 0, proc.stderr
    command = tomllib.loads(proc.stdout)["command"]
    a = subprocess.run(["bash", "-c", FAKE_SRUN + f"source {script}"], cwd=tmp_path, capture_output=True, text=True)
    b = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
    assert a.stdout == b.stdout and "'--data-dir', './data dir'" in a.stdout, (a.stdout, b.stdout, command)
    assert "UNUSED=$(false): a shell variable the command does not use" in proc.stderr


SEED_002 = Path(__file__).parent / "data" / "seed002"


def test_seed_002s_prelaunch_and_launcher_convert_into_a_job_that_runs_as_submitted_by_hand(cluster, tmp_path):
    """Seed 002 (lit-gpt on Enroot): the prelaunch exports its environment,
    then `exec srun --mpi=none ./train-redpajama-launcher.sh` in an if/else whose other branch is an
    interactive `srun --overlap`; the launcher maps Slurm's variables to ranks and runs the trainer.
    Before, kit convert took the script's last line (`kill $GPT_TIMESTAMPING_PID`) for the command: a
    job that trained nothing. Now the job runs the launcher on every task with the exported variables,
    and each rank prints what it prints when the script is submitted with sbatch by hand. The launcher
    starts `nvidia-smi dmon &` on local rank 0 and ends with its `kill`: where nvidia-smi is not, that kill
    (and on the other ranks its `[ $SLURM_LOCALID -eq 0 ]`) is the launcher's last status, so by hand the job
    FAILS after training; converted, the launcher runs inlined without them (kit's gpu-dmon sidecar does
    that), and the job's status is the trainer's."""
    (tmp_path / "pretrain").mkdir()
    for name in ("train-redpajama-prelaunch.sh", "train-redpajama-launcher.sh"):
        (tmp_path / name).write_text((SEED_002 / name).read_text())
        (tmp_path / name).chmod(0o755)
    (tmp_path / "pretrain" / "redpajama.py").write_text((SEED_002 / "redpajama.py").read_text())
    proc = kit("convert", "train-redpajama-prelaunch.sh", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    command = tomllib.loads(proc.stdout)["command"]
    assert command[:2] == ["bash", "-c"] and "\nexport GPT_WORLD_SIZE=$SLURM_STEP_NUM_TASKS\n" in command[2], command
    assert "nvidia-smi dmon" not in command[2] and "kill $GPT" not in command[2], command
    assert command[2].rstrip().endswith('--local_rank "$GPT_LOCAL_RANK"'), command
    assert "./train-redpajama-launcher.sh: its nvidia-smi dmon … &; GPT_NVIDIA_SMI_DMON_PID=$!;" in proc.stderr
    assert 'export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"' in command[2] and "MASTER_PORT" not in command[2]
    assert (
        "srun --overlap --nodes=1 --ntasks-per-node=8 ./train-redpajama-launcher.sh: only the training command"
        in proc.stderr
    )
    assert "DEBUG, GPT_GLOBAL_SEED, SLURM_INTERACTIVE: carried, but their $(...) now runs in every task" in proc.stderr
    (tmp_path / "job.toml").write_text(proc.stdout)
    hand = (
        cluster.target.run(
            ["sbatch", "--parsable", f"--output={tmp_path / 'by-hand.out'}", "train-redpajama-prelaunch.sh"],
            cwd=str(tmp_path),
        )
        .stdout.strip()
        .split(";")[0]
    )
    run = kit(
        "launch",
        "--local",
        "--wait",
        "--no-exporter",
        "-f",
        "job.toml",
        "--output-dir",
        str(tmp_path / "jobs"),
        cwd=tmp_path,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert slurm.wait(cluster.target, hand, timeout=120).state == "FAILED"  # the seed's last line, by hand
    job_dir = Path(run.stdout.split("job dir: ")[1].splitlines()[0].strip())
    by_hand = sorted(line for line in (tmp_path / "by-hand.out").read_text().splitlines() if line.startswith("rank "))
    by_kit = sorted(
        line
        for log in (job_dir / "logs").glob("rank-*.log")
        for line in log.read_text().splitlines()
        if line.startswith("rank ")
    )
    assert len(by_hand) == 4 and by_kit == by_hand, (by_hand, by_kit)
    assert (
        by_hand[0] == "rank 0 of 4 node 0 local 0 nodes 2 faulthandler 1 nccl WARN INIT,NET debug 0 master True "
        "seeded True"
    )


def test_seed_002_with_its_sbatch_line_converts_into_a_job_that_runs_in_the_image(cluster, cpu_image, tmp_path):
    """Seed 002 as its document submits it: a file holding its sbatch line (the nodes and the container: the image,
    no home, remap-root, the code directory as the working directory and mounted onto itself, data and output
    mounted inside it), the prelaunch it submits and the launcher that starts `nvidia-smi dmon`. `kit convert
    submit.sh` converts the prelaunch with that line's options (before: a job whose command ran `sbatch`); drops
    the code directory's mount onto itself and the working directory there (kit shows the job its code view, and
    such a mount covers the job directory under it: launch refused it), runs `python` as python3 (kit's image has
    python3 alone) and the launcher without its dmon; the job file, as converted, runs first try from the code
    directory with kit's defaults, in the image, every rank printing what the launcher mapped."""
    scratch = tmp_path / "scratch"
    code = scratch / "py-in-container" / "lit-gpt"
    (code / "pretrain").mkdir(parents=True)
    for name in ("train-redpajama-prelaunch.sh", "train-redpajama-launcher.sh", "submit.sh"):
        (code / name).write_text((SEED_002 / name).read_text())
        (code / name).chmod(0o755)
    (code / "pretrain" / "redpajama.py").write_text((SEED_002 / "redpajama.py").read_text())
    for args in (["init", "-q"], ["add", "."], ["-c", "user.email=u@x", "-c", "user.name=u", "commit", "-qm", "one"]):
        subprocess.run(["git", *args], cwd=code, check=True)
    (scratch / "data").mkdir()
    (scratch / "out" / "slurm").mkdir(parents=True)
    (scratch / "home" / "containers").mkdir(parents=True)
    image = scratch / "home" / "containers" / "pytorch-23.10.sqsh"
    image.symlink_to(cpu_image)
    proc = kit("convert", "submit.sh", cwd=code, env={"SCRATCH": str(scratch)})
    assert proc.returncode == 0, proc.stderr
    job = tomllib.loads(proc.stdout)
    assert (job["image"], job["mounts"], job["container_mount_home"], job["container_remap_root"]) == (
        str(image),
        [f"{scratch}/data:{code}/data", f"{scratch}/out:{code}/out"],
        False,
        True,
    ), proc.stdout
    assert "container_workdir" not in job and (job["nodes"], job["ntasks_per_node"]) == (2, 2), proc.stdout
    assert "$(python3 -c 'import numpy" in job["command"][2] and "nvidia-smi dmon" not in job["command"][2]
    changed = [line for line in proc.stderr.splitlines() if line.startswith("kit: changed: ")]
    assert changed[0].startswith("kit: changed: sbatch … ./train-redpajama-prelaunch.sh: the file submits"), changed
    assert any(f"--container-workdir={code}: the directory you submit from" in c for c in changed), changed
    assert any(f"{code}:{code}: the directory you submit from, mounted onto itself: dropped" in c for c in changed)
    assert any("a relative path such as data/ is the work tree's own" in c for c in changed), changed
    assert any(c.startswith("kit: changed: python: ") for c in changed), changed
    (code / "job.toml").write_text(proc.stdout)
    run = kit("launch", "--local", "--wait", "--no-exporter", "-f", "job.toml", cwd=code, timeout=600)
    job_dir = Path(run.stdout.split("job dir: ")[1].splitlines()[0].strip())
    assert job_dir.parent == code / "kit-jobs", job_dir  # kit's default, under the code directory
    assert run.returncode == 0, run.stderr + "".join(p.read_text() for p in (job_dir / "logs").glob("slurm-*"))
    ranks = sorted(
        line
        for log in (job_dir / "logs").glob("rank-*.log")
        for line in log.read_text().splitlines()
        if line.startswith("rank ")
    )
    assert ranks == [
        f"rank {r} of 4 node {r // 2} local {r % 2} nodes 2 faulthandler 1 nccl WARN INIT,NET debug 0 "
        "master True seeded True"
        for r in range(4)
    ], ranks
