"""What kit generates: golden files, bash -n, shellcheck, and quoting proven on
arbitrary strings (done-means 6)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest
from helpers import REPO, require, task_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kit import slurm
from kit import submission as launch
from kit.core import spec as specs

GOLDEN = Path(__file__).parent / "golden"
ACCEPT = "KIT_ACCEPT_GOLDEN=1 python -m pytest tests/test_scripts.py"
GOLDEN_DIR = Path("/jobs/golden-job")


def golden_job() -> specs.ResolvedJob:
    spec = specs.JobSpec(
        command=["python", "train.py", "--lr", "3e-4", "it's"],
        nodes=2,
        gpus_per_node=8,
        cpus_per_task=12,
        mem="256G",
        time="4:00:00",
        partition="gpu",
        account="ml",
        job_name="golden",
        output_dir="/jobs",
        env={"HF_HOME": "/data/hf cache", "A": "$x"},
        sbatch_args=["--constraint=h100"],
        sidecars=["echo sidecar on $(hostname)"],
    )
    return launch.resolve(spec)


def sweep_job() -> specs.ResolvedJob:
    """A sweep of per-node launchers: the task's own command, torchrun's variables, --mpi."""
    spec = specs.JobSpec(
        command=["torchrun", "--nproc-per-node", "4", "train.py", "--lr", "{lr}", "--tag={tag}", "{{literal}}"],
        nodes=2,
        gpus_per_node=4,
        ntasks_per_node=1,
        job_name="sweep",
        output_dir="/jobs",
        sweep={"lr": ["1e-3", "3e-4"], "tag": ["a b", "it's"]},
        array="%2",
        mpi="pmi2",
    )
    return launch.resolve(spec)


JOBS = {"": golden_job, "sweep.": sweep_job}


def generated(kind: str = "") -> dict[str, str]:
    """What kit writes for the job besides the scripts it copies as they ship: job.env, sbatch.json."""
    job = JOBS[kind]()
    # prelaunch names the host's Python (for the exporter outside containers): pin it.
    with mock.patch.object(sys, "executable", "/usr/bin/python3"):
        files = {"job.env": launch.job_env(launch.job_values(job, GOLDEN_DIR))}
    files["sbatch.json"] = json.dumps(slurm.sbatch_argv(job, GOLDEN_DIR), indent=2) + "\n"
    return {kind + name: text for name, text in files.items()}


NAMES = [kind + name for kind in JOBS for name in ("job.env", "sbatch.json")]


def kind_of(name: str) -> str:
    return next(k for k in sorted(JOBS, key=len, reverse=True) if name.startswith(k))


@pytest.mark.parametrize("name", NAMES)
def test_golden(name):
    text = generated(kind_of(name))[name]
    path = GOLDEN / name
    if os.environ.get("KIT_ACCEPT_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; create it with: {ACCEPT}"
    assert text == path.read_text(), f"{name} changed; if that is intended, accept it with: {ACCEPT}"


def test_a_job_directory_holds_the_scripts_as_they_ship_and_its_values(tmp_path):
    """prepare writes launch/'s scripts byte for byte, and job.env as job_env renders it: the values are the only
    part of a job's bash that kit generates."""
    job = golden_job()
    files = launch.render_scripts(job, GOLDEN_DIR)
    assert set(files) == {*launch.SHIPPED, "job.env"}
    for name in launch.SHIPPED:
        assert files[name] == (REPO / "launch" / name).read_text(), name
    assert files["job.env"] == launch.job_env(launch.job_values(job, GOLDEN_DIR))
    assert len(files["job.env"].splitlines()) < 80  # a page; the 2,100 lines pasted from six templates are gone


@pytest.mark.parametrize("kind", list(JOBS))
def test_bash_n_and_shellcheck_on_the_scripts_as_they_ship(kind, tmp_path):
    """shellcheck follows each script into what it sources: launch/'s parts and a job's job.env."""
    require("shellcheck")
    for name in launch.SHIPPED:
        (tmp_path / name).write_text((REPO / "launch" / name).read_text())
    (tmp_path / "job.env").write_text(generated(kind)[kind + "job.env"])
    for name in [*launch.SHIPPED, "job.env"]:
        subprocess.run(["bash", "-n", str(tmp_path / name)], check=True)
    proc = subprocess.run(
        ["shellcheck", "--severity=style", "--external-sources", *launch.SHIPPED, "job.env"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout


@pytest.mark.parametrize("name", launch.SHIPPED)
def test_every_return_in_the_shipped_scripts_names_its_status(name):
    """The teardown runs in the EXIT trap, where a bare `return` gives the status of the command
    before the trap: after a failed command, a test that held returned false (kit::_runtime_own
    did, and the launcher stopped the container runtime's FUSE daemons under the task)."""
    text = (REPO / "launch" / name).read_text()
    bare = [
        f"{n}: {line.strip()}"
        for n, line in enumerate(text.splitlines(), 1)
        if re.search(r"(^\s*|[;&|{]\s*)return\s*($|[;}])", line.split("#", 1)[0])
    ]
    assert bare == [], "\n".join(bare)


def test_the_runtime_is_told_apart_in_the_exit_trap_of_a_failed_command():
    """lib.sh's kit::_runtime_own, called from an EXIT trap after a command failed: the runtime's
    process is still its own (a bare `return` there returned the failed command's status)."""
    script = f"""set -euo pipefail
source {REPO / "launch" / "lib.sh"}
kit::lib_init
sleep 30 &
pid=$!
kit::_start_time "$pid"
KIT_RUNTIME=("$pid:$KIT_START_TIME")
finish() {{
  if kit::_runtime_own "$pid"; then echo own; else echo "not own"; fi
  kit::tree $$
  echo "tree: ${{#KIT_TREE[@]}}"
  kill "$pid"
}}
trap finish EXIT
false
"""
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.stdout.splitlines() == ["own", "tree: 1"], proc.stdout + proc.stderr


def test_a_fork_that_runs_the_exit_trap_tears_nothing_down():
    """kit::cleanup run in a fork of the script (a helper signalled before its first command runs
    carries the EXIT trap: it once ran a second teardown beside the script's) touches nothing; the
    script's own cleanup still stops its background processes."""
    script = f"""set -euo pipefail
source {REPO / "launch" / "lib.sh"}
kit::lib_init
kit::spawn sleeper sleep 30
sleeper="${{KIT_BG_PIDS[0]}}"
( kit::cleanup )
kit::running "$sleeper" && echo "alive after the fork's cleanup"
trap kit::cleanup EXIT
exit 0
"""
    mark = f"KIT_TEST_MARK={os.getpid()}-{time.time_ns()}"  # this test's sleeper, not another test's
    env = {**os.environ, "KIT_TEST_MARK": mark.split("=", 1)[1]}
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0 and proc.stdout.splitlines() == ["alive after the fork's cleanup"], (
        proc.stdout + proc.stderr
    )
    sleepers = subprocess.run(["pgrep", "-f", "^sleep 30$"], capture_output=True, text=True).stdout.split()
    assert not [
        pid
        for pid in sleepers
        if Path(f"/proc/{pid}/environ").exists() and mark.encode() in Path(f"/proc/{pid}/environ").read_bytes()
    ], "the script's cleanup left it"


def test_dry_run_job_dir_is_complete_and_sbatch_argv_recorded(tmp_path):
    job = launch.resolve(specs.JobSpec(command=["true"], output_dir=str(tmp_path)))
    prepared = launch.prepare(job)
    names = sorted(p.name for p in prepared.job_dir.iterdir())
    assert names == sorted(["job.env", "job.json", "logs", "sbatch.json", *launch.SHIPPED])
    assert json.loads((prepared.job_dir / "sbatch.json").read_text()) == prepared.sbatch_argv
    assert json.loads((prepared.job_dir / "job.json").read_text())["command"] == ["true"]
    assert os.access(prepared.job_dir / "launcher.sh", os.X_OK) and os.access(
        prepared.job_dir / "prelaunch.sh", os.X_OK
    )
    assert (prepared.job_dir / "job.env").stat().st_mode & 0o777 == 0o600  # --env values may be secrets
    assert not list(tmp_path.glob(".*tmp"))


# Strings that would run something if they were ever expanded, plus arbitrary text.
PAYLOADS = [
    "$(touch {canary})",
    "`touch {canary}`",
    "'; touch {canary}; '",
    '"; touch {canary}; "',
    "$HOME",
    "${HOME}",
    "\\",
    "\n",
    "a b",
    "*",
    "~",
    "!!",
    "$'\\x41'",
    "%j %x",
    "é—😀",
    "",
]
text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=24)


def value_strategy(canary: Path):
    return st.one_of(text, st.sampled_from([p.replace("{canary}", str(canary)) for p in PAYLOADS]))


DUMP = (
    "import json, os, sys; json.dump({'argv': sys.argv[1:], 'value': os.environ.get('USER_VALUE'), "
    "'job_name': os.environ.get('SLURM_JOB_NAME'), 'job_dir': os.environ.get('KIT_JOB_DIR')}, "
    "open(os.environ['KIT_JOB_DIR'] + '/seen-' + os.environ['RANK'] + '.json', 'w'))"
)


def run_launcher_directly(job_dir: Path) -> subprocess.CompletedProcess:
    """The launcher as one task would run it, with Slurm's task variables set."""
    env = task_env(job_dir, USER_VALUE="from-test")
    return subprocess.run(["bash", str(job_dir / "launcher.sh")], env=env, capture_output=True, text=True, timeout=30)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_command_arguments_reach_the_command_byte_for_byte(tmp_path, data):
    canary = tmp_path / "CANARY"
    args = data.draw(st.lists(value_strategy(canary), max_size=5))
    job = launch.resolve(specs.JobSpec(command=[sys.executable, "-c", DUMP, *args], output_dir=str(tmp_path)))
    prepared = launch.prepare(job)
    proc = run_launcher_directly(prepared.job_dir)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads((prepared.job_dir / "seen-0.json").read_text())
    assert seen["argv"] == args
    assert not canary.exists()


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_user_field_reaches_a_real_job_byte_for_byte(cluster, tmp_path, data):
    """Through sbatch, prelaunch, srun and the launcher on the real cluster."""
    canary = tmp_path / "CANARY"
    values = value_strategy(canary)
    args = data.draw(st.lists(values, max_size=4), label="args")
    env_value = data.draw(values, label="env value")
    job_name = data.draw(values.filter(lambda s: s != ""), label="job name")
    # A backslash cannot appear in sbatch's --output (kit refuses it; see test_cli).
    dir_part = data.draw(values.filter(lambda s: "/" not in s and "\\" not in s), label="output dir part")
    out = tmp_path / ("d-" + dir_part)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kit",
            "launch",
            "--local",
            "--wait",
            "--json",
            "--job-name",
            job_name,
            "--env",
            f"USER_VALUE={env_value}",
            "--output-dir",
            str(out),
            "--",
            sys.executable,
            "-c",
            DUMP,
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    job_dir = json.loads(proc.stdout)["job_dir"]
    seen = json.loads(Path(job_dir, "seen-0.json").read_text())
    assert seen == {"argv": args, "value": env_value, "job_name": job_name, "job_dir": job_dir}
    assert Path(job_dir).parent == out
    assert not canary.exists()


SWEEP_DUMP = (
    "import json, os, sys; json.dump(dict(argv=sys.argv[1:], sweep=os.environ.get('KIT_SWEEP_v'), "
    "job_dir=os.environ.get('KIT_JOB_DIR')), open(os.environ['KIT_JOB_DIR'] + '/seen.json', 'w'))"
)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_sweep_values_reach_a_real_job_byte_for_byte(cluster, tmp_path, data):
    """A sweep value, in the command ({v}, next to literal braces written {{ }}) and
    as KIT_SWEEP_v, through sbatch, prelaunch, srun and the launcher."""
    canary = tmp_path / "CANARY"
    # The command line separates values with commas.
    values = value_strategy(canary).filter(lambda s: "," not in s and s != "x")
    v = data.draw(values, label="sweep value")
    literal = data.draw(values, label="text around it")
    word = literal.replace("{", "{{").replace("}", "}}") + "{v}"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kit",
            "launch",
            "--local",
            "--wait",
            "--json",
            "--sweep",
            f"v=x,{v}",
            "--array",
            "1",
            "--output-dir",
            str(tmp_path / "jobs"),
            "--",
            sys.executable,
            "-c",
            SWEEP_DUMP,
            word,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    task = Path(json.loads(proc.stdout)["job_dir"]) / "tasks" / "1"
    assert json.loads((task / "seen.json").read_text()) == {"argv": [literal + v], "sweep": v, "job_dir": str(task)}
    assert not canary.exists()


def test_every_variable_prelaunch_exports_is_kept_by_container_env():
    """Inside a container the image's variables win except for --container-env names:
    every variable prelaunch.sh exports must be in that list (KIT_PYTHON is host-only)."""
    from kit.slurm import pyxis

    text = "\n".join((REPO / "launch" / name).read_text() for name in launch.SHIPPED if name.startswith("prelaunch"))
    exported = set(re.findall(r"\bexport ([A-Z][A-Z0-9_]*)", text))
    exported |= {n for line in re.findall(r"\bexport ([A-Z][A-Z0-9_ ]*)$", text, re.M) for n in line.split()}
    exported -= {"KIT_PYTHON"}  # host-only: outside a container
    assert "KIT_PROMETHEUS_TARGETS" in exported
    assert exported <= set(pyxis.JOB_VARIABLES), sorted(exported - set(pyxis.JOB_VARIABLES))
    assert "MASTER_ADDR" in exported and "KIT_JOB_DIR" in exported
