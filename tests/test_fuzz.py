"""The CLI fuzz test: every command driven with generated arguments
and files. Whatever comes in, kit exits 0, 1 or 2, never with a traceback,
creates nothing outside the output directory it was given, and submits
nothing when it exits 2.

Commands run in this process through :func:`kit.cli.main` (milliseconds an
example), except the exporter, which runs as a subprocess (a valid one would
serve forever; each is given an unwritable targets directory last, so a
valid configuration ends there, exit 1). Examples are derandomized so CI is
repeatable; ``KIT_FUZZ_EXAMPLES=N KIT_FUZZ_RANDOM=1`` explores further.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kit.cli import main

EXAMPLES = int(os.environ.get("KIT_FUZZ_EXAMPLES", "120"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not os.environ.get("KIT_FUZZ_RANDOM"),
    database=None,
    suppress_health_check=list(HealthCheck),
)

NASTY = [
    "",
    "-",
    "--",
    "0",
    "-1",
    "1",
    "2",
    "65536",
    "99999999999999999999",
    "1e400",
    "nan",
    "inf",
    "/",
    "..",
    "../x",
    "a,b",
    "a:b",
    "x\n",
    "x\ty",
    "$(touch PWNED)",
    "`touch PWNED`",
    "'",
    '"',
    "\\",
    "%j",
    "é",
    " ",
    "/dev/null",
    "/proc/x",
    "/etc/passwd",
    "docker://x",
    "K=V",
    "=",
    "x=" + "y" * 140_000,
    "\x00",
    "-N3",
    "--nodes=3",
    "--output=/tmp/x",
    "1-2",
    "2-1",
    "0-65536",
    "29500-30499",
    "USR1",
    "SIGKILL",
    "ro",
    "rw+ro",
    "/tmp:/",
    "/tmp:/data:ro",
    "10\n",
    "1:00:00",
    "3-00:00:00",
    "--",
    "-h",
    "--help",
]
TEXT = st.one_of(
    st.sampled_from(NASTY), st.text(st.characters(max_codepoint=0x2FF, blacklist_categories=("Cs",)), max_size=30)
)
INT = st.one_of(st.integers(-(2**70), 2**70).map(str), st.sampled_from(["0", "1", "2", "-1", "x", ""]))

LAUNCH_VALUED = {
    "--nodes": INT,
    "--gpus-per-node": INT,
    "--ntasks-per-node": INT,
    "--cpus-per-task": INT,
    "--mem": TEXT,
    "--time": TEXT,
    "--partition": TEXT,
    "--account": TEXT,
    "--job-name": TEXT,
    "--env": TEXT,
    "--sbatch-arg": TEXT,
    "--sidecar": TEXT,
    "--signal": TEXT,
    "--signal-lead": INT,
    "--max-restarts": INT,
    "--heartbeat": INT,
    "--port-range": TEXT,
    "--master-interface": TEXT,
    "--hang-timeout": INT,
    "--first-progress-timeout": INT,
    "--stop-grace": INT,
    "--step-wait": INT,
    "--image": TEXT,
    "--mount": TEXT,
    "--container-workdir": TEXT,
    "--container-env": TEXT,
    "--container-name": TEXT,
    "--exporter-ports": TEXT,
    "--prometheus-targets": TEXT,
    "--array": st.one_of(TEXT, st.sampled_from(["0-3", "%2", "1,3", "0-2%1"])),
    "--sweep": st.one_of(TEXT, st.sampled_from(["lr=0.1,0.01", "x={y}", "a=1,2,3"])),
    "--mpi": TEXT,
}
LAUNCH_FLAGS = [
    "--debug",
    "--no-debug",
    "--container-writable",
    "--container-mount-home",
    "--container-remap-root",
    "--no-mount-check",
    "--no-exporter",
    "--json",
]
JOB_KEYS = [
    "nodes",
    "gpus_per_node",
    "ntasks_per_node",
    "time",
    "job_name",
    "env",
    "sbatch_args",
    "image",
    "mounts",
    "command",
    "max_restarts",
    "port_range",
    "signal",
    "hang_timeout",
    "output_dir",
    "sidecars",
    "unknown_key",
    "container_env",
    "exporter",
    "sweep",
    "array",
    "mpi",
]
TOML_VALUE = st.recursive(
    st.one_of(TEXT, st.integers(-(2**63), 2**63 - 1), st.booleans(), st.floats(allow_nan=False)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["a", "K", "x y"]), inner, max_size=2)
    ),
    max_leaves=4,
)


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v) if not isinstance(v, float) or v == v and abs(v) != float("inf") else "0"
    if isinstance(v, str):
        return '"' + "".join(c if c.isprintable() and c not in '"\\' else f"\\u{ord(c):04x}" for c in v) + '"'
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{toml_value(k)} = {toml_value(x)}" for k, x in v.items()) + "}"


JOB_FILE = st.one_of(
    st.dictionaries(st.sampled_from(JOB_KEYS), TOML_VALUE, max_size=5).map(
        lambda d: "".join(f"{k} = {toml_value(v)}\n" for k, v in d.items())
    ),
    TEXT,
)


@st.composite
def launch_args(draw) -> tuple[list[str], str | None]:
    args = []
    for opt in draw(st.lists(st.sampled_from(sorted(LAUNCH_VALUED)), max_size=6)):
        value = draw(LAUNCH_VALUED[opt])
        args += [f"{opt}={value}"] if draw(st.booleans()) else [opt, value]
    args += draw(st.lists(st.sampled_from(LAUNCH_FLAGS), max_size=2))
    job_file = draw(st.none() | JOB_FILE)
    if job_file is not None:
        args += ["--job-file", "job.toml"]
    command = draw(st.lists(TEXT, max_size=3))
    if command or draw(st.booleans()):
        args += ["--", *command]
    return args, job_file


@contextlib.contextmanager
def sandbox(files: dict[str, str] | None = None):
    """A fresh empty working directory (and files in it); gives (dir, what was there)."""
    old = os.getcwd()
    d = Path(tempfile.mkdtemp(prefix="kit-fuzz-"))
    for name, text in (files or {}).items():
        (d / name).write_text(text, errors="surrogateescape")
    os.chdir(d)
    try:
        yield d
    finally:
        os.chdir(old)
        subprocess.run(["rm", "-rf", "--one-file-system", str(d)], check=False)


def run_kit(argv: list[str]) -> tuple[int, str, str]:
    """kit's command line in this process: (exit code, stdout, stderr). An
    exception other than SystemExit is a traceback: the test fails with it."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return code, out.getvalue(), err.getvalue()


def check(code: int, err: str, cwd: Path, allowed: set[str]) -> None:
    assert code in (0, 1, 2), (code, err)
    assert "Traceback" not in err, err
    made = {p.name for p in cwd.iterdir()} - allowed
    assert not made, f"created outside the output directory: {made}"


@FUZZ
@given(launch_args())
def test_fuzz_launch_dry_run(drawn):
    args, job_file = drawn
    files = {"job.toml": job_file} if job_file is not None else {}
    with sandbox(files) as cwd:
        code, _, err = run_kit(["launch", "--dry-run", "--output-dir", "out", *args])
        check(code, err, cwd, {"out", *files})
        assert not list(cwd.rglob("PWNED"))


@pytest.fixture(scope="module")
def held(cluster):
    """Job ids the submitting fuzz test made (held, never run): cancelled at the end."""
    ids: list[str] = []
    yield ids
    if ids:
        subprocess.run(["scancel", *ids], env={**os.environ, **cluster.target.env}, check=True)


@settings(FUZZ, max_examples=max(EXAMPLES // 4, 10))
@given(launch_args())
def test_fuzz_launch_submits_nothing_when_it_refuses(cluster, held, drawn):
    """Real submissions to the local cluster, held so they never run."""
    args, job_file = drawn
    if "--" in args:
        args = args[: args.index("--")] + ["--sbatch-arg=--hold"] + args[args.index("--") :]
    else:
        args = [*args, "--sbatch-arg=--hold"]
    files = {"job.toml": job_file} if job_file is not None else {}
    with sandbox(files) as cwd:
        code, out, err = run_kit(["launch", "--local", "--json", "--output-dir", "out", *args])
        check(code, err, cwd, {"out", *files})
        ids = re.findall(r'"job_id": "(\d+)"', out)
        held.extend(ids)
        if code == 2:
            assert ids == [], out
            squeue = cluster.target.run(["squeue", "--noheader", "--format=%i %o"], check=False).stdout
            assert str(cwd) not in squeue, squeue
            assert not (cwd / "out").exists() or list((cwd / "out").iterdir()) == []


RECIPE_KEYS = ["description", "base", "steps", "entrypoint", "cmd", "labels", "volumes", "unknown"]
BASE = st.dictionaries(
    st.sampled_from(["rootfs", "tarball", "oci", "docker-archive", "squashfs", "image", "x"]),
    st.one_of(TEXT, st.just("tiny")),
    min_size=0,
    max_size=2,
)
STEP = st.dictionaries(st.sampled_from(["copy", "env", "workdir", "x"]), TOML_VALUE, min_size=0, max_size=2)


@st.composite
def recipes(draw) -> str:
    text = ""
    for key in draw(
        st.lists(
            st.sampled_from(["description", "entrypoint", "cmd", "labels", "volumes", "unknown"]),
            max_size=3,
            unique=True,
        )
    ):
        text += f"{key} = {toml_value(draw(TOML_VALUE))}\n"
    if draw(st.booleans()):
        base = draw(BASE)
        text += "[base]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in base.items())
    for step in draw(st.lists(STEP, max_size=3)):
        text += "[[steps]]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in step.items())
    return draw(st.one_of(st.just(text), TEXT))


@pytest.fixture(autouse=True, scope="module")
def no_process_wide_containment():
    """`kit build` moves its own process into a mount namespace of its own, ties its children to
    it and turns SIGTERM into an unwinding (kit.cli.build._contain): right for the command, whose
    process does nothing else, wrong for this test process: the local cluster's daemons would no
    longer see what later tests mount (a scratch file system's jobs). Builds run in-process here
    skip it; they unmount as they go."""
    import kit.cli.build as build_command

    saved = build_command._contain
    build_command._contain = lambda: None
    yield
    build_command._contain = saved


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from images import tiny_rootfs

    return tiny_rootfs(tmp_path_factory.mktemp("fuzz-tiny") / "rootfs")


@settings(FUZZ, max_examples=max(EXAMPLES // 2, 10))
@given(
    recipes(),
    st.lists(
        st.sampled_from(
            [
                "--compression=zstd",
                "--compression=x",
                "--no-cache",
                "--base=x",
                "--base=rootfs=/nonexistent",
                "-o",
                "--",
            ]
        ),
        max_size=2,
    ),
)
def test_fuzz_build(tiny, recipe, extra):
    recipe = recipe.replace('"tiny"', f'"{tiny}"')
    with sandbox({"r.toml": recipe, "payload": "x\n"}) as cwd:
        code, _, err = run_kit(["build", "r.toml", *extra, "-o", "out/x.sqsh"])
        check(code, err, cwd, {"out", "r.toml", "payload"})


@FUZZ
@given(
    st.sampled_from(["report", "inspect", "cluster", "cluster status", "cluster env", "cluster down", ""]),
    st.lists(TEXT, max_size=3),
    st.binary(max_size=200),
)
def test_fuzz_other_commands(command, words, blob):
    with sandbox({"blob": blob.decode("latin-1")}) as cwd:
        env = {"KIT_HOME": str(cwd / "out" / "home")}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            code, _, err = run_kit(
                [*command.split(), *words, *(["--output-dir", "out"] if command == "report" else [])]
            )
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        check(code, err, cwd, {"out", "blob"})


@settings(FUZZ, max_examples=max(EXAMPLES // 6, 8))
@given(
    st.lists(
        st.sampled_from(
            [
                "--port",
                "--interval",
                "--bind",
                "--label",
                "--naming",
                "--advertise",
                "--training-dir",
                "--log",
                "--hostname-label",
                "--no-gpu",
                "--no-node",
            ]
        ),
        max_size=4,
    ),
    # what a real command line can carry: no NUL, under the kernel's per-argument limit
    st.lists(TEXT.filter(lambda v: "\x00" not in v and len(v) < 100_000), min_size=4, max_size=4),
)
def test_fuzz_exporter(options, values):
    argv, given = [], set()
    for opt, value in zip(options, values):
        argv += [opt] if opt.startswith("--no-") else [opt, value]
        if opt == "--log" and value and not value.startswith("/"):
            given.add(Path(value).parts[0] if Path(value).parts else value)  # a file it was told to write
    with sandbox() as cwd:
        proc = subprocess.run(
            [sys.executable, "-m", "kit", "exporter", *argv, "--targets-dir", "/proc/kit-fuzz/x"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=cwd,
            env={**os.environ, "SLURM_JOB_ID": "1"},
        )
        check(proc.returncode, proc.stderr, cwd, given)
