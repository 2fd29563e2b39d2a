"""The command line: help everywhere, exact messages and exit codes for bad input,
and nothing written or submitted when input is bad."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner
from helpers import REPO, kit

from kit import __version__, slurm
from kit.cli import cli


def walk(command: click.Command, path=()):
    """Every command under ``command``, through the lazy group's own lookup (its
    ``commands`` dict stays empty until a command is asked for)."""
    yield path, command
    if isinstance(command, click.Group):
        ctx = click.Context(command, info_name="kit")
        for name in command.list_commands(ctx):
            yield from walk(command.get_command(ctx, name), (*path, name))


def test_every_command_has_help_text():
    runner = CliRunner()
    seen = [" ".join(path) for path, _ in walk(cli)]
    for name in ("launch", "build", "cluster up", "cluster down", "ps", "logs", "cancel", "report", "exporter"):
        assert name in seen, f"the help walk misses kit {name}: {seen}"
    for path, command in walk(cli):
        assert command.help, f"kit {' '.join(path)} has no help text"
        result = runner.invoke(cli, [*path, "--help"], prog_name="kit")
        assert result.exit_code == 0, result.output
        assert result.output.startswith(f"Usage: kit {' '.join(path)}".rstrip())
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                assert param.help, f"kit {' '.join(path)} {param.opts[0]} has no help text"


def test_version():
    result = CliRunner().invoke(cli, ["--version"])
    assert result.output == f"kit, version {__version__}\n"


def test_dry_run_imports_neither_torch_nor_lightning(tmp_path):
    code = (
        "import sys; from kit.cli import main\n"
        "try:\n main(['launch', '--dry-run', '--output-dir', sys.argv[1], '--', 'python', '-m', 'kit.train'])\n"
        "except SystemExit as e:\n assert e.code == 0, e.code\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'lightning', 'pytorch_lightning'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, capture_output=True)


def test_dry_run_prints_the_sbatch_line_and_writes_the_scripts(tmp_path):
    proc = kit(
        "launch",
        "--dry-run",
        "--nodes",
        "2",
        "--time",
        "30",
        "--output-dir",
        str(tmp_path),
        "--no-code-snapshot",
        "--",
        "python",
        "train.py",
        "--max-steps",
        "100",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    line, srun_line, jobdir_line = proc.stdout.splitlines()
    job_dir = jobdir_line.removeprefix("job dir: ")
    assert srun_line == (
        f"srun --kill-on-bad-exit=1 --export=ALL --wait=60 --mpi=none --label --nodes=2 --ntasks-per-node=1 --ntasks=2 "
        f"{job_dir}/launcher.sh"
    )
    assert line == (
        f"sbatch --parsable --chdir={tmp_path} --job-name=kit --nodes=2 --ntasks-per-node=1 --open-mode=append "
        f"--output={job_dir}/logs/slurm-%j.out --signal=B:USR1@90 --time=30 --requeue "
        f"{job_dir}/prelaunch.sh {job_dir}"
    )
    assert proc.stderr == ""


BAD = [
    (["--nodes", "0"], "kit: --nodes: must be at least 1, got 0"),
    (["--nodes", "-3"], "kit: --nodes: must be at least 1, got -3"),
    (["--nodes", "two"], "kit: --nodes: 'two' is not a valid integer"),
    (["--mem", "12X"], "kit: --mem: not a memory size: '12X'"),
    (["--mem", "-5G"], "kit: --mem: not a memory size: '-5G'"),
    (["--time", "1:99:00"], "kit: --time: not a time limit: '1:99:00' (a field is out of range)"),
    (["--time", "soon"], "kit: --time: not a time limit: 'soon'"),
    (["--env", "FOO"], "kit: --env: expected KEY=VALUE, got 'FOO'"),
    (["--env", "1X=2"], "kit: --env: not a variable name: '1X'"),
    (["--env", "WORLD_SIZE=3"], "kit: --env: WORLD_SIZE is set by the launcher from Slurm's variables"),
    (["--job-file", "/nonexistent/job.toml"], "kit: --job-file: no such job file: /nonexistent/job.toml"),
    (
        ["--gpus-per-node", "8", "--ntasks-per-node", "3"],
        "kit: --ntasks-per-node: 3 tasks per node do not match 8 GPUs per node",
    ),
    (["--sbatch-arg=--nodes=3"], "kit: --sbatch-arg: --nodes is set by kit"),
    (["--sbatch-arg=-N3"], "kit: --sbatch-arg: -N is set by kit"),
    (["--sbatch-arg=-vt1"], "kit: --sbatch-arg: -t is set by kit"),
    (["--sbatch-arg=-o/tmp/x-%j.out"], "kit: --sbatch-arg: -o is set by kit"),
    (["--sbatch-arg=--outp=/tmp/x"], "kit: --sbatch-arg: --output is set by kit"),
    (["--sbatch-arg=--no-requeu"], "kit: --sbatch-arg: --no-requeue is set by kit"),
    (["--signal", "KILL"], "kit: --signal: not a warning signal: 'KILL'"),
    (["--time", "1", "--signal-lead", "90"], "kit: --signal-lead: the warning comes 90 s before a time limit of 60 s"),
    (
        ["--output-dir", "/tmp/a\\b"],
        "kit: --output-dir: '/tmp/a\\\\b' contains a backslash, which sbatch's --output cannot express",
    ),
    (["--nodes", "99999999999999999999"], "kit: --nodes: must be at most 2147483647, got 99999999999999999999"),
    (["--stop-grace", "4294967296"], "kit: --stop-grace: must be at most 2147483647, got 4294967296"),
    (["--job-name", "n" * 1100], "kit: --job-name: 1100 characters; at most 200"),
    (["--sbatch-arg=--wrap=hostname"], "kit: --sbatch-arg: --wrap is set by kit"),
    (["--sidecar", "exporter: sleep 1"], "kit: --sidecar: two sidecars named 'exporter'"),
    (["--sidecar", "w: a", "--sidecar", "w: b"], "kit: --sidecar: two sidecars named 'w'"),
    (["--sidecar", "a/b: sleep 1"], "kit: --sidecar: sidecar name 'a/b' is not a name"),
]


def test_an_owned_sbatch_option_hint_reads_as_a_sentence(tmp_path):
    """Not "use kit's the command after -- … instead"."""
    proc = kit("launch", "--dry-run", "--output-dir", str(tmp_path), "--sbatch-arg=--wrap=hostname", "--", "true")
    assert proc.stderr.splitlines()[1] == "hint: kit sets it itself: the command after -- (kit writes the batch script)"
    proc = kit("launch", "--dry-run", "--output-dir", str(tmp_path), "--sbatch-arg=-N3", "--", "true")
    assert proc.stderr.splitlines()[1] == "hint: use kit's --nodes instead"


@pytest.mark.parametrize("args,message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_clear_message_and_exit_2(tmp_path, args, message):
    out = tmp_path / "jobs"
    proc = kit("launch", "--dry-run", "--output-dir", str(out), *args, "--", "true")
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert lines[0] == message
    assert len(lines) <= 2 and all(line.startswith("hint: ") for line in lines[1:])
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not out.exists()


def test_command_missing_after_double_dash(tmp_path):
    proc = kit("launch", "--dry-run", "--nodes", "2", "--output-dir", str(tmp_path / "jobs"), "--")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "kit: command: no command to run",
        "hint: put the command after --, e.g. kit launch --nodes 2 -- python -m kit.train",
    ]
    assert not (tmp_path / "jobs").exists()


@pytest.mark.parametrize(
    "text,message",
    [
        ("nodes = 2\nbogus = 1\n", "kit: {f}: unknown key 'bogus'"),
        ('nodes = "2"\n', "kit: {f}: nodes: expected a whole number, got str '2'"),
        (
            "nodes = 2\ntime = 1:00\n",
            "kit: {f}: not valid TOML: Expected newline or end of document after a statement (at line 2, column 9)",
        ),
        ('command = "python train.py"\n', "kit: {f}: command: expected a list of strings, got str 'python train.py'"),
        ('nodes = 0\ncommand = ["true"]\n', "kit: {f}: nodes: must be at least 1, got 0"),
        ("x = " + "[" * 100_000 + "]" * 100_000 + "\n", "kit: {f}: not valid TOML: nested too deep"),
    ],
    ids=["unknown key", "string count", "bad TOML", "string command", "zero nodes", "nested"],
)
def test_bad_job_file(tmp_path, text, message):
    job_file = tmp_path / "job.toml"
    job_file.write_text(text)
    proc = kit("launch", "--dry-run", "--job-file", str(job_file), "--output-dir", str(tmp_path / "jobs"))
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[0] == message.format(f=job_file)
    assert not (tmp_path / "jobs").exists()


def test_job_file_values_and_command_line_overrides(tmp_path):
    job_file = tmp_path / "job.toml"
    job_file.write_text(
        'nodes = 4\ntime = "2:00:00"\njob-name = "from-file"\n'
        'command = ["python", "-m", "kit.train"]\nenv = { A = "1", B = "2" }\n'
    )
    proc = kit(
        "launch",
        "--dry-run",
        "--json",
        "-f",
        str(job_file),
        "--nodes",
        "2",
        "--env",
        "B=3",
        "--output-dir",
        str(tmp_path / "jobs"),
    )
    assert proc.returncode == 0, proc.stderr
    import json

    out = json.loads(proc.stdout)
    assert out["job_id"] is None
    argv = out["sbatch_argv"]
    assert "--nodes=2" in argv and "--time=2:00:00" in argv and "--job-name=from-file" in argv
    spec = json.loads(open(out["job_dir"] + "/job.json").read())
    assert spec["env"] == {"A": "1", "B": "3"} and spec["command"] == ["python", "-m", "kit.train"]


def test_unknown_partition_submits_nothing(cluster, target, tmp_path):
    before = subprocess.run(
        ["squeue", "--noheader", "--states=all", "--format=%i"], env={**target.env}, capture_output=True, text=True
    ).stdout
    proc = kit("launch", "--local", "--partition", "nope", "--output-dir", str(tmp_path / "jobs"), "--", "true")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == ["kit: --partition: unknown partition 'nope'", "hint: partitions here: local"]
    after = subprocess.run(
        ["squeue", "--noheader", "--states=all", "--format=%i"], env={**target.env}, capture_output=True, text=True
    ).stdout
    assert after == before
    assert not (tmp_path / "jobs").exists()


@pytest.mark.parametrize("bad", ["prom,targets", "prom targets"])
def test_the_local_clusters_targets_path_is_validated_like_a_given_one(cluster, tmp_path, monkeypatch, bad):
    """The local cluster's Prometheus targets directory is chosen before the job
    is validated, so a path pyxis cannot mount (a comma or a space in KIT_HOME) is refused
    with the other checks, nothing written, instead of a broken --container-mounts."""
    from kit import targets
    from kit.cluster import LocalCluster
    from kit.core import spec as specs
    from kit.errors import KitError

    monkeypatch.setattr(LocalCluster, "prometheus_targets", property(lambda self: tmp_path / bad))
    (tmp_path / bad).mkdir()  # its Prometheus runs: each user's directory in it
    image = tmp_path / "x.sqsh"
    image.write_bytes(b"hsqs" + b"\0" * 100)
    spec = specs.JobSpec(command=["true"], image=str(image), output_dir=str(tmp_path / "jobs"))
    with pytest.raises(KitError) as e:
        targets.plan(spec, where="local")
    assert e.value.field == "the local cluster's Prometheus targets directory"
    assert "the targets directory" in e.value.message and not (tmp_path / "jobs").exists()
    # Given on the command line, the label is the option; without an image there is nothing to mount.
    with pytest.raises(KitError) as e:
        targets.plan(
            specs.JobSpec(command=["true"], image=str(image), prometheus_targets=str(tmp_path / bad)), where="local"
        )
    assert e.value.field == "--prometheus-targets"
    plan = targets.plan(specs.JobSpec(command=["true"], output_dir=str(tmp_path / "jobs")), where="local")
    assert plan.job.spec.prometheus_targets == str(tmp_path / bad / "root") and plan.target.name == "local"


def test_local_without_a_cluster_says_how_to_start_one(tmp_path):
    proc = kit(
        "launch",
        "--local",
        "--output-dir",
        str(tmp_path / "jobs"),
        "--",
        "true",
        env={"KIT_HOME": str(tmp_path / "empty-home")},
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "kit: --local: the local cluster is not running",
        "hint: start it with: kit cluster up --nodes 2",
    ]


def test_launch_help_is_a_map_grouped_by_topic_in_the_readmes_order():
    """Every option in one topic group (none left over), --help prints the
    groups with their purpose, and docs/launch.md's option table has the same groups in
    the same order, each option under its own group."""
    import re

    import click

    from kit.cli.help import option_name
    from kit.cli.launch import GROUPS, launch

    ctx = click.Context(launch)
    groups = launch.grouped(ctx)
    assert [title for title, _, _ in groups] == [title for title, _, _ in GROUPS]  # no "Other options"
    help_text = kit("launch", "--help").stdout
    sections = [line[:-1] for line in help_text.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert sections == [title for title, _, _ in GROUPS]
    for title, purpose, _ in GROUPS:
        assert f"{title}:\n  {purpose}\n" in help_text
    readme = (REPO / "docs" / "launch.md").read_text()
    table = readme[readme.index("| option | meaning |") : readme.index("A job file uses the option names")]
    readme_groups, current = {}, None
    for row in table.splitlines():
        if m := re.match(r"\| \*\*(.+?)\*\* \|", row):
            current = m.group(1)
            readme_groups[current] = ""
        elif current:
            readme_groups[current] += row.split(" | ")[0]
    assert list(readme_groups) == [title for title, _, _ in GROUPS]
    for title, _, params in groups:
        for p in params:
            if option_name(ctx, p) == "help":
                continue
            name = max(p.opts, key=len)
            assert f"`{name}" in readme_groups[title] or f", {name}" in readme_groups[title], (title, name)


def test_requests_slurm_could_never_run_are_refused_before_submission(cluster, tmp_path):
    """More nodes or CPUs than the partition has (Slurm would queue
    the job for good), a stop grace that Slurm's KillWait cuts short: exit 2, nothing written."""
    out = tmp_path / "jobs"
    cases = [
        (["--nodes", "3"], "kit: --nodes: the default partition has 2 node(s); 3 asked for would wait forever"),
        (
            ["--cpus-per-task", "3", "--ntasks-per-node", "2"],
            "kit: --cpus-per-task: 1 node(s) with 6 CPUs each: the default partition has 0 such node(s) "
            "(its largest has 4 CPUs); the job would wait forever",
        ),
        (
            ["--stop-grace", "30"],
            "kit: --stop-grace: a grace of 30 s would be cut short: Slurm kills a job's "
            "processes 30 s (KillWait) after it signals them",
        ),
        (
            ["--mem", "64T"],
            "kit: --mem: 1 node(s) with 64T of memory each: the default partition has 0 such node(s) "
            f"(its largest has {cluster.state().memory_mb} MB for jobs); the job would wait forever",
        ),
        # GPUs are checked as CPUs are, and named (not blamed on --cpus-per-task).
        (
            ["--gpus-per-node", "4"],
            "kit: --gpus-per-node: 1 node(s) with 4 GPUs each: the default partition has 0 "
            "such node(s) (its largest has 2 GPUs); Slurm would refuse the job",
        ),
        (
            ["--gpus-per-node", "2", "--env", "CUDA_VISIBLE_DEVICES=1"],
            "kit: --env: CUDA_VISIBLE_DEVICES: Slurm binds each task's 2 GPU(s) and sets it itself, replacing this "
            "value",
        ),
    ]
    for args, message in cases:
        proc = kit("launch", "--local", "--output-dir", str(out), *args, "--", "true")
        assert (proc.returncode, proc.stderr.splitlines()[0]) == (2, message), proc.stderr
        assert not out.exists()


def test_parsable_prints_only_the_job_id(cluster, tmp_path):
    """`kit launch --parsable` prints the id alone, as sbatch does."""
    proc = kit("launch", "--local", "--parsable", "--wait", "--output-dir", str(tmp_path / "jobs"), "--", "true")
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(r"\d+\n", proc.stdout), proc.stdout
    assert f"kit: job {proc.stdout.strip()} ended COMPLETED" in proc.stderr
    both = kit("launch", "--parsable", "--json", "--output-dir", str(tmp_path / "jobs"), "--", "true")
    assert both.returncode == 2 and both.stderr.startswith("kit: --parsable: ") and not (tmp_path / "jobs2").exists()


def test_a_per_task_variable_in_an_argument_without_a_shell_is_warned(tmp_path):
    """`--node_rank=$SLURM_NODEID` with no shell reaches torchrun literally."""
    out = tmp_path / "jobs"
    plain = kit(
        "launch",
        "--dry-run",
        "--output-dir",
        str(out),
        "--",
        "torchrun",
        "--node_rank=$SLURM_NODEID",
        "--nproc-per-node",
        "2",
        "train.py",
        "--global_rank",
        "${RANK}",
    )
    assert plain.returncode == 0, plain.stderr
    warned = [line for line in plain.stderr.splitlines() if line.startswith("kit: warning: the argument")]
    assert [w.split("'")[1] for w in warned] == ["--node_rank=$SLURM_NODEID", "${RANK}"], plain.stderr
    assert "bash -c 'torchrun ... --node_rank=$SLURM_NODEID ...'" in warned[0]
    for command in (["bash", "-c", "torchrun --node_rank=$SLURM_NODEID train.py"], ["python", "t.py", "--lr", "$5"]):
        quiet = kit("launch", "--dry-run", "--output-dir", str(out), "--", *command)
        assert quiet.returncode == 0 and "warning" not in quiet.stderr, quiet.stderr


def test_a_drained_node_is_named_at_launch_and_cluster_up_resumes_it(cluster, tmp_path):
    """A job needing a node Slurm drained is warned about (with Slurm's
    reason), and `kit cluster up` (documented as repairing) resumes the node."""
    env = {**os.environ, **cluster.target.env}
    subprocess.run(["scontrol", "update", "NodeName=node2", "State=DRAIN", "Reason=kit test"], env=env, check=True)
    try:
        proc = kit(
            "launch", "--local", "--nodes", "2", "--dry-run", "--output-dir", str(tmp_path / "jobs"), "--", "true"
        )
        assert proc.returncode == 0, proc.stderr  # a dry run asks Slurm nothing
        proc = kit(
            "launch", "--local", "--nodes", "2", "--parsable", "--output-dir", str(tmp_path / "jobs"), "--", "true"
        )
        assert proc.returncode == 0, proc.stderr
        assert "kit: warning: node2 (drain: kit test): Slurm holds back this node; the job waits" in proc.stderr
        # kit ps shows Slurm's own words on why it waits (squeue's %R), not only the reason's name.
        job_id = proc.stdout.strip()

        def reason():
            rows = json.loads(kit("ps", "--json", "--output-dir", str(tmp_path / "jobs")).stdout)
            row = next(r for r in rows if r["id"] == job_id)
            return row["reason"] if "node2" in row["reason"] or "DRAIN" in row["reason"].upper() else None

        from helpers import wait_for

        assert wait_for(reason, 60, poll=1, what="Slurm's reason naming the drained node")
        up = kit("cluster", "up")
        assert up.returncode == 0 and "resuming node2 (Slurm had it drain: kit test)" in up.stderr, up.stderr
        state = subprocess.run(
            ["sinfo", "--noheader", "--Node", "--nodes=node2", "--format=%t"], env=env, capture_output=True, text=True
        ).stdout.split()
        assert state and "drain" not in state[0], state
        job_id = proc.stdout.strip()
        assert slurm.wait(cluster.target, job_id, timeout=120).state == "COMPLETED"
    finally:
        subprocess.run(["scontrol", "update", "NodeName=node2", "State=RESUME"], env=env, check=False)


def test_launch_inside_an_salloc_allocation_says_it_submits_a_separate_job(cluster, tmp_path):
    """`kit launch` typed in an salloc shell submits its own job: kit says so."""
    kit_cmd = f"{sys.executable} -m kit launch --local --parsable --output-dir {tmp_path / 'jobs'} -- true"
    proc = subprocess.run(
        ["salloc", "--nodes", "1", "bash", "-c", kit_cmd],
        capture_output=True,
        text=True,
        env={**os.environ, **cluster.target.env},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    allocation = re.search(r"Granted job allocation (\d+)", proc.stderr).group(1)
    assert (
        f"kit: note: this shell is inside Slurm job {allocation} (an salloc allocation or a job): kit launch "
        "submits a separate job" in proc.stderr
    ), proc.stderr
    job_id = proc.stdout.strip()
    assert job_id.isdigit() and job_id != allocation
    assert slurm.wait(cluster.target, job_id, timeout=120).state == "COMPLETED"


def test_every_launch_option_is_declared_once_in_the_option_table(tmp_path):
    """kit.core.options is the one declaration; the JobSpec fields, defaults, job-file
    types, minimums, Click options and their [default: …] help all come from it."""
    import dataclasses

    from kit.cli.launch import launch
    from kit.core import options
    from kit.core import spec as specs

    table = {o.name for o in options.OPTIONS}
    clicked = {p.name for p in launch.params} - {"help"}
    assert clicked == table, clicked ^ table
    assert [f.name for f in dataclasses.fields(specs.JobSpec)] == [o.name for o in options.SPEC_OPTIONS]
    assert specs.DEFAULTS == {o.name: o.default for o in options.SPEC_OPTIONS if o.default is not None}
    help_text = " ".join(kit("launch", "--help").stdout.split())
    for o in options.OPTIONS:
        if o.default_text or (o.kind in (options.INT, options.STR) and o.default is not None):
            shown = o.default_text or str(o.default)
            assert f"[default: {' '.join(shown.split())}]" in help_text.replace("- ", "-"), o.name
        if o.minimum is not None:  # a minimum in the table is enforced, with the field's label
            job = tmp_path / f"{o.name}.toml"
            job.write_text(f'command = ["true"]\n{o.name} = {o.minimum - 1}\n')
            proc = kit("launch", "--dry-run", "-f", str(job), "--output-dir", str(tmp_path / "jobs"))
            assert proc.returncode == 2 and f"must be at least {o.minimum}" in proc.stderr, (o.name, proc.stderr)
    # A job file's value types follow the kinds.
    job = tmp_path / "bad.toml"
    job.write_text('command = ["true"]\nstop_grace = "3"\n')
    proc = kit("launch", "--dry-run", "-f", str(job))
    assert proc.returncode == 2 and "expected a whole number" in proc.stderr


def test_no_hint_names_the_unrelated_pypi_project():
    """`pip install 'kit[...]'` installs an unrelated project (PyPI's kit);
    the distribution is kit-slurm. No hint, message or README line names the other."""
    bad = []
    for path in [
        *(REPO / "kit").rglob("*.py"),
        REPO / "README.md",
        *(REPO / "docs").glob("*.md"),
        *(REPO / "containers").glob("*.md"),
    ]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"pip install ['\"]?kit(\[|['\"\s]|$)", line):
                bad.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert bad == [], bad


def test_a_recipe_hint_has_no_literal_escape(tmp_path):
    """The [base] hint is one readable line, not a literal backslash-n."""
    recipe = tmp_path / "r.toml"
    recipe.write_text("[base]\n")
    proc = kit("build", str(recipe), "-o", str(tmp_path / "out.sqsh"))
    assert proc.returncode == 2 and "[base] needs exactly one of" in proc.stderr, proc.stderr
    assert "\\n" not in proc.stderr and "hint: e.g. a [base] table with the line rootfs = " in proc.stderr


def test_a_step_that_never_started_is_told_so(cluster, tmp_path):
    """With `--mpi pmix` (listed by Debian's Slurm, no PMIx library on the nodes)
    srun fails before any rank runs: --wait says the step never started, not that the command failed."""
    proc = kit(
        "launch",
        "--local",
        "--wait",
        "--no-exporter",
        "--mpi",
        "pmix",
        "--output-dir",
        str(tmp_path / "jobs"),
        "--",
        "true",
        timeout=180,
    )
    assert proc.returncode != 0 and "ended FAILED: the job step never started" in proc.stderr, proc.stderr
    assert "the command failed" not in proc.stderr and "srun, its MPI plugin or the container failed" in proc.stderr
    # A batch script killed by a signal before any rank ran (128+N) is told as that signal.
    killed = slurm.job_outcome(slurm.JobStatus("1", "FAILED", exit_code=138), tmp_path / "jobs")
    assert "the batch script ended by SIGUSR1 before any rank ran" in killed.meaning, killed.meaning


def test_ps_filters_by_state_name_age_and_owner(cluster, tmp_path):
    """`kit ps --state/--name/--since/--user` narrow the list."""
    import pwd

    out = str(tmp_path / "jobs")
    for name, command in (("alpha-train", "true"), ("beta-eval", "false")):
        kit("launch", "--local", "--wait", "--no-exporter", "--job-name", name, "--output-dir", out, "--", command)

    def names(*args: str) -> list[str]:
        proc = kit("ps", "--json", "--output-dir", out, *args)
        assert proc.returncode == 0, proc.stderr
        return sorted(r["name"] for r in json.loads(proc.stdout) if r["job_dir"].startswith(out))

    me = pwd.getpwuid(os.geteuid()).pw_name
    assert names() == ["alpha-train", "beta-eval"]
    assert names("--state", "failed") == ["beta-eval"] and names("--state", "completed,failed") == names()
    assert names("--state", "active") == [] and names("--name", "alpha") == ["alpha-train"]
    assert names("--name", "*-eval") == ["beta-eval"] and names("--since", "1h", "--user", me) == names()
    assert names("--user", "nobody") == []
    bad = kit("ps", "--since", "soon")
    assert bad.returncode == 2 and bad.stderr.startswith("kit: --since: not an age: 'soon'")


@pytest.mark.parametrize(
    "args,message",
    [
        (["--state", "RUNNNING"], "kit: --state: no job is ever in state RUNNNING"),
        (["--state", "active,done"], "kit: --state: no job is ever in state DONE"),
        (["--user", "no-such-user-here"], "kit: --user: no user 'no-such-user-here' on this machine"),
    ],
)
def test_a_ps_filter_that_could_match_nothing_is_one_line_and_exit_2(tmp_path, args, message):
    """A misspelt state or an unknown user would list nothing, said as "no jobs": refused instead."""
    proc = kit("ps", "--output-dir", str(tmp_path), *args, env={"KIT_HOME": str(tmp_path / "home")})
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0] == message and len(lines) == 2 and lines[1].startswith("hint: "), lines


def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path):
    """`kit --host … logs | head -1`: the output written outside Click's own (kit.remote streams a login
    node's bytes) to a pipe nobody reads any more ends kit quietly, as Click ends a command's own."""
    import subprocess
    import sys

    script = (
        "import sys, kit.cli as c\n"
        "def stream(**kw):\n    sys.stdout.buffer.write(b'x' * 200000)\n    sys.stdout.buffer.flush()\n"
        "c.cli.main = stream\nc.main(['ps'])\n"
    )
    for args in ([sys.executable, "-c", script], [sys.executable, "-m", "kit", "launch", "--help"]):
        r, w = os.pipe()
        os.close(r)
        proc = subprocess.run(args, stdout=w, stderr=subprocess.PIPE, text=True, timeout=60)
        os.close(w)
        assert proc.returncode == 1 and proc.stderr == "", proc.stderr
