"""Rules for the bash half (launch/), as tests/test_layers.py has them for the Python: a function a
reader can hold (at most 60 lines), and no function that hands a result to another through a global
the script does not declare in its state (top-level assignments: the values block, lib.sh's state)."""

from __future__ import annotations

import re
import shlex
import time
from pathlib import Path

LAUNCH = Path(__file__).resolve().parent.parent / "launch"
FUNCTION = re.compile(r"^([a-z_:]+)\(\) \{\s*$")
NAME = r"[A-Za-z_][A-Za-z0-9_]*"
MAX_FUNCTION_LINES = 60


def functions(text: str) -> list[tuple[str, int, int, list[str]]]:
    """(name, first line, last line, body lines) of every top-level function (``name() {`` … ``}``)."""
    out, current = [], None
    for number, line in enumerate(text.splitlines(), 1):
        if current is None:
            m = FUNCTION.match(line)
            if m:
                current = (m.group(1), number, [])
        elif line == "}":
            out.append((current[0], current[1], number, current[2]))
            current = None
        else:
            current[2].append(line)
    return out


def code_lines(lines: list[str]) -> list[str]:
    """``lines`` without the bodies of here-documents (another language's text: a python3 - <<'PY' block)."""
    out, end = [], None
    for line in lines:
        if end is not None:
            if line.strip() == end:
                end = None
            continue
        out.append(line)
        m = re.search(r"<<-?\s*'?\"?(" + NAME + r")'?\"?\s*$", line)
        if m and "<<<" not in line:
            end = m.group(1)
    return out


def words(line: str) -> list[str]:
    """The line's shell words, comments dropped (a line shlex cannot split: split on blanks)."""
    try:
        return shlex.split(line, comments=True)
    except ValueError:
        return line.split("#", 1)[0].split()


def assigned(line: str) -> list[str]:
    """Names the line assigns in the shell running it: ``NAME=…``/``NAME+=…`` standing alone (not a
    prefix of a command: ``NAME=v cmd`` sets it for cmd only), the names ``read``/``mapfile``/``printf -v``
    fill, and loop variables. ``local``/``declare``/``export``/``readonly`` lines are declarations."""
    w = words(line)
    if not w or w[0] in ("local", "declare", "export", "readonly"):
        return []
    out, i = [], 0
    while i < len(w) and re.fullmatch(NAME + r"(\[[^]]*\])?\+?=.*", w[i], re.S):
        i += 1
    if i and (i == len(w) or w[i] in (";", "&&", "||", "then", "do")):
        out += [re.match(NAME, x).group(0) for x in w[:i]]
    for k, word in enumerate(w):
        if word in ("read", "mapfile", "readarray") and (
            k == 0 or w[k - 1] in ("|", "&&", "||", ";", "!", "if", "while", "until", "{", "then")
        ):
            rest = [x for x in w[k + 1 :] if x not in ("<", "<<<")]
            options_with_value = {"-d", "-u", "-t", "-n", "-N", "-p", "-C", "-c", "-s", "-O", "-i"}
            j = 0
            while j < len(rest) and rest[j].startswith("-"):
                j += 2 if rest[j] in options_with_value - ({"-t"} if word != "read" else set()) else 1
            names = []
            for x in rest[j:]:
                if not re.fullmatch(NAME, x):
                    break
                names.append(x)
            out += names if word == "read" else names[:1]
        if word == "printf" and k + 2 < len(w) and w[k + 1] == "-v":
            out.append(re.match(NAME, w[k + 2]).group(0))
        if word == "for" and k + 1 < len(w):
            m = re.match(r"(?:\(\(\s*)?(" + NAME + ")", w[k + 1])
            if m:
                out.append(m.group(1))
    return out


def declared_at_top(*texts: str) -> set[str]:
    """The script's state: every name assigned or declared outside a function."""
    names = set()
    for text in texts:
        inside = {n for _, a, b, _ in functions(text) for n in range(a, b + 1)}
        for number, line in enumerate(text.splitlines(), 1):
            if number in inside:
                continue
            w = words(line)
            if w and w[0] in ("declare", "readonly", "export", "local"):
                names.update(re.match(NAME, x).group(0) for x in w[1:] if re.match(NAME, x))
            names.update(assigned(line))
    return names


def violations(scripts: dict[str, str], lib: str) -> list[str]:
    bad = []
    for name, text in scripts.items():
        top = declared_at_top(text, lib if name != "lib.sh" else "")
        for fn, first, last, body in functions(text):
            if last - first + 1 > MAX_FUNCTION_LINES:
                bad.append(f"{name}:{first} {fn} is {last - first + 1} lines (at most {MAX_FUNCTION_LINES})")
            body = code_lines(body)
            local = set()
            for line in body:
                w = words(line)
                if w and w[0] in ("local", "declare"):
                    local.update(re.match(NAME, x).group(0) for x in w[1:] if re.match(NAME, x))
            for line in body:
                for var in assigned(line):
                    if var not in local and var not in top and var != "_":
                        bad.append(f"{name}:{first} {fn} assigns {var}: neither local nor declared in the state")
    return sorted(set(bad))


def templates() -> dict[str, str]:
    """launch/'s scripts as a job runs them: prelaunch.sh with what it sources (prelaunch_*.sh), whose state
    block they share; launcher.sh; lib.sh."""
    from kit.submission import SHIPPED

    parts = [name for name in SHIPPED if name.startswith("prelaunch_")]
    return {
        "prelaunch.sh": "\n".join((LAUNCH / name).read_text() for name in ("prelaunch.sh", *parts)),
        "launcher.sh": (LAUNCH / "launcher.sh").read_text(),
        "lib.sh": (LAUNCH / "lib.sh").read_text(),
    }


def test_every_script_in_launch_is_shipped():
    """A new file in launch/ is copied into every job directory (a script nobody ships would escape the rules)."""
    from kit.submission import SHIPPED

    assert {p.name for p in LAUNCH.glob("*.sh")} == set(SHIPPED)


def private_helper_violations(scripts: dict[str, str], parts: list[str]) -> list[str]:
    """In the parts a script sources, a function no other file calls is named ``kit::_…`` (a private helper, as
    enroot's own are), and a ``kit::_…`` function is called from its own file alone."""
    bad = []
    for name, text in scripts.items():
        for fn, *_ in functions(text):
            used_elsewhere = [
                n for n, other in scripts.items() if n != name and re.search(re.escape(fn) + r"(?![a-z_])", other)
            ]
            if fn.startswith("kit::_") and used_elsewhere:
                bad.append(f"{name}: {fn} is private, but {', '.join(used_elsewhere)} calls it")
            elif name in parts and not fn.startswith("kit::_") and not used_elsewhere:
                bad.append(f"{name}: {fn} is called from {name} alone: name it kit::_{fn[len('kit::') :]}")
    return bad


def test_private_helpers_are_named_as_such():
    from kit.jobdir import JobDir

    scripts = {p.name: p.read_text() for p in LAUNCH.glob("*.sh")}
    assert private_helper_violations(scripts, list(JobDir.SCRIPT_PARTS)) == []
    planted = {"a.sh": "kit::one() {\n  kit::_two\n}\n", "lib.sh": "kit::_two() {\n  :\n}\nkit::three() {\n  :\n}\n"}
    assert private_helper_violations(planted, ["lib.sh"]) == [
        "lib.sh: kit::_two is private, but a.sh calls it",
        "lib.sh: kit::three is called from lib.sh alone: name it kit::_three",
    ]


def test_every_bash_function_is_short_and_declares_what_it_assigns():
    scripts = templates()
    assert violations(scripts, scripts["lib.sh"]) == []


def test_the_rules_see_a_long_function_and_an_undeclared_global():
    lib = "KIT_STATE=\n"
    ok = 'f() {\n  local x\n  x=1\n  KIT_STATE=2\n  read -r x _ <<<"a b"\n  KIT_T=3 true\n}\n'
    assert violations({"a.sh": ok}, lib) == []
    assert violations({"a.sh": "f() {\n  rc=1\n}\n"}, lib) == [
        "a.sh:1 f assigns rc: neither local nor declared in the state"
    ]
    assert violations({"a.sh": "f() {\n  read -r -a line <x\n}\n"}, lib)[0].endswith(
        "assigns line: neither local nor declared in the state"
    )
    assert violations({"a.sh": "f() {\n  for i in 1 2; do :; done\n}\n"}, lib) != []
    long = "f() {\n" + "  :\n" * 60 + "}\n"
    assert violations({"a.sh": long}, lib) == ["a.sh:1 f is 62 lines (at most 60)"]


# ------------------------------------------------------------------ facts bash and Python share
def bash_functions(*names: str) -> str:
    """The text of the named functions of prelaunch.sh and its parts (to run them alone)."""
    text = templates()["prelaunch.sh"].splitlines()
    out = []
    for name, first, last, _ in functions("\n".join(text)):
        if name in names:
            out += text[first - 1 : last]
    assert len([n for n in names if f"{n}() {{" in "\n".join(out)]) == len(names), names
    return "\n".join(out) + "\n"


def run_bash(script: str, env: dict) -> str:
    import subprocess

    proc = subprocess.run(
        ["bash", "-s"],  # the script on stdin: a long one is past what one argument may hold (128 KiB)
        input="set -euo pipefail\n" + script,
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_run_record_bash_writes_is_what_json_dumps_writes_and_bash_reads_it_back(tmp_path):
    """runs.jsonl's one bash writer (kit::_append_run) writes json.dumps's text; its one bash reader
    (kit::read_run) reads json.dumps's records, skips a torn line and finds a run's last record."""
    import json

    runs = tmp_path / "runs.jsonl"
    fns = bash_functions("kit::_append_run", "kit::read_run", "kit::restarted_here")
    counted = run_bash(
        fns
        + "declare -A KIT_RECORD=()\nkit::restarted_here\nkit::_append_run 0 killed -1 -1 null null\n"
        + "kit::_append_run 1 hang 1 4 true 1764000000001 '' restart\n"
        + "kit::_append_run 1 finished 0 12 true 1764000000123 134\nkit::restarted_here\n",
        {"KIT_RUNS_FILE": str(runs)},
    )
    assert counted.split() == ["0", "1"]  # runs followed by a run in their own allocation: before, after
    hang = json.loads(runs.read_text().splitlines().pop(1))
    assert hang["then"] == "restart" and "teardown_exit_code" not in hang
    runs.write_text("".join(line + "\n" for n, line in enumerate(runs.read_text().splitlines()) if n != 1))
    lines = runs.read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [json.dumps(r) for r in records] == lines
    assert records[0] == {
        "run": 0,
        "end": "killed",
        "exit_code": -1,
        "checkpoint_step": -1,
        "advanced": None,
        "time": records[0]["time"],
        "start_ms": None,
        "end_ms": records[0]["end_ms"],
    }
    assert records[0]["time"] == records[0]["end_ms"] // 1000 and abs(records[0]["end_ms"] / 1000 - time.time()) < 5
    assert records[1]["teardown_exit_code"] == 134 and records[1]["advanced"] is True
    assert records[1]["start_ms"] == 1764000000123
    from kit.jobdir.records import RunRecord, run_records

    typed = run_records(tmp_path)  # Python's one parser reads what bash wrote, typed
    assert [(r.run, r.end, r.exit_code, r.checkpoint_step, r.advanced, r.teardown_exit_code) for r in typed] == [
        (0, "killed", -1, -1, None, None),
        (1, "finished", 0, 12, True, 134),
    ]
    assert (typed[0].start_ms, typed[1].start_ms, typed[1].end_ms) == (None, 1764000000123, records[1]["end_ms"])
    assert (typed[0].then, RunRecord.parse(hang).then) == (None, "restart")
    assert RunRecord.parse({"run": 0, "end": "failed", "exit_code": True}) is None  # a bool is no exit code
    written = [
        {"run": 0, "end": "warned", "exit_code": 143, "checkpoint_step": 5, "advanced": True, "time": 100},
        {"run": 1, "end": "hang", "exit_code": 1, "checkpoint_step": 5, "advanced": False, "time": 200},
        {"run": 1, "end": "failed", "exit_code": 3, "checkpoint_step": 5, "advanced": False, "time": 201},
        {
            "run": 2,
            "end": "finished",
            "exit_code": 0,
            "checkpoint_step": 9,
            "advanced": True,
            "time": 300,
            "teardown_exit_code": 134,
        },
    ]
    runs.write_text("".join(json.dumps(r) + "\n" for r in written) + '{"run": 3, "end": "fin')
    out = run_bash(
        fns + "declare -A KIT_RECORD=()\nfor r in 1 last 0 7; do\n"
        '  if kit::read_run "$r"; then echo "$r ${KIT_RECORD[run]} ${KIT_RECORD[end]} ${KIT_RECORD[exit_code]} '
        '${KIT_RECORD[checkpoint_step]} ${KIT_RECORD[advanced]} ${KIT_RECORD[time]}"; else echo "$r none"; fi\n'
        "done\n",
        {"KIT_RUNS_FILE": str(runs)},
    )
    assert out.splitlines() == [
        "1 1 failed 3 5 false 201",
        "last 2 finished 0 9 true 300",
        "0 0 warned 143 5 true 100",
        "7 none",
    ]


def test_the_first_failing_rank_is_one_rule_in_bash_and_python(tmp_path):
    """prelaunch's kit::first_failure (awk) and kit.jobdir.failures.first_failure (Python) pick the same
    rank's code from the same exit records: by time, then rank; only ranks that failed by themselves."""
    import random

    from kit.jobdir import failures
    from kit.jobdir.layout import JobDir

    fns = bash_functions("kit::_rank_ends", "kit::first_failure")
    rng = random.Random(31)
    for case in range(40):
        job = tmp_path / f"job{case}"
        logs = JobDir(job).logs
        logs.mkdir(parents=True)
        times = [rng.choice([1_000_000_000, 1_000_000_000, 2_000_000_000, 3_000_000_000]) for _ in range(12)]
        for rank, t in enumerate(times):
            how = rng.choice(["self", "self", "stopped", "warned"])
            code = rng.choice([0, 0, 1, 3, 143, 137])
            (logs / f"exit.r0.rank-{rank}").write_text(f"{t} {rank} {code} {how}\n")
        out = run_bash(
            fns + "if kit::first_failure; then :; else echo none; fi\n", {"KIT_LOG_DIR": str(logs), "KIT_RESTART": "0"}
        ).strip()
        first = failures.first_failure(job, 0)
        assert out == (str(first.exit_code) if first else "none"), case


def test_how_a_run_ended_is_one_table_that_bash_and_python_read_alike():
    """kit.core.ending's rows, rendered into prelaunch.sh, pick in bash (kit::_ending over kit::_run_facts's
    words) the row Python's conclude picks, for every combination of a run's facts; and the picks are the
    rules kit keeps: a hang is never finished, a run is finished only when declared or when every rank
    ended by itself with 0 (never for a function job without declaring), a stop never exits 0."""
    import itertools

    from kit.core import bash, ending

    combos = [
        dict(zip(ending.FLAGS, bits), rc=rc)
        for bits in itertools.product("01", repeat=len(ending.FLAGS))
        for rc in ending.RC
    ]
    lines = [" ".join(f"{k}={v}" for k, v in facts.items()) for facts in combos]
    fns = bash_functions("kit::_facts_hold", "kit::_ending")
    out = run_bash(
        f"readonly -a KIT_ENDINGS=( {bash.array(ending.as_bash())} )\n"
        + fns
        + 'while IFS= read -r facts; do kit::_ending "${facts}"; done <<"FACTS"\n'
        + "\n".join(lines)
        + "\nFACTS\n",
        {},
    )
    picked = out.splitlines()
    assert len(picked) == len(combos) == 1536
    for facts, row in zip(combos, picked):
        want = ending.conclude(facts)
        assert row == want.row(), facts
        if facts["preflight"] == "1":  # no command ran: never finished, whatever else the run saw
            assert want.end == "preflight" and want.requeue and want.suspect and want.code != "0"
        elif facts["hang"] == "1":
            assert want.end == "hang" and want.requeue
        elif facts["straggler"] == "1" and facts["declared"] == "0":  # warned for a straggler: never finished
            assert want.end == "straggler" and want.requeue and want.suspect and want.code != "0"
        if want.end == "finished":
            assert facts["declared"] == "1" or (
                facts["all_done"] == "1" and facts["rc"] == "zero" and facts["function"] == "0"
            )
        if (
            facts["stopping"] == "1"
            and facts["declared"] == facts["warned"] == facts["hang"] == facts["preflight"] == facts["straggler"] == "0"
        ):
            assert want.code != "0" and want.end == "stopped"
        assert want.code != "0" or want.end == "finished"
        if want.end == "failed" and facts["restart_failed"] == "0":
            assert not want.requeue, facts  # a failed command restarts the run only when asked (--on-failure)
    ends = {"finished", "failed", "warned", "stopped", "hang", "incomplete", "preflight", "straggler"}
    assert {e.end for e in ending.ENDINGS} <= ends


def test_the_tracker_identity_bash_gives_is_pythons_and_a_users_own_is_kept(tmp_path, monkeypatch):
    """prelaunch's kit::tracker_env gives the run id kit.jobdir's JobDir.tracker_run_id names (a job, an array
    task), reads back the MLflow run kit.train.trackers wrote (json.dumps's text), passes KIT_RESUME_STEP, and
    keeps what the job's environment already set."""
    from kit.jobdir import JobDir
    from kit.train import trackers

    job = tmp_path / "train-20261125-000000-abcdef"
    task = JobDir(job).task(3).path
    task.mkdir(parents=True)
    fns = bash_functions("kit::tracker_env")
    show = 'kit::tracker_env\necho "$WANDB_RUN_ID $WANDB_NAME $WANDB_RESUME ${MLFLOW_RUN_ID-none} $KIT_RESUME_STEP $WANDB_DIR"\n'
    for where in (job, task):
        env = {"KIT_SCRIPTS_DIR": str(job), "KIT_JOB_DIR": str(where), "KIT_START_STEP": "-1"}
        rid = JobDir(where).tracker_run_id
        assert run_bash(fns + show, env).split() == [rid, rid, "allow", "none", "-1", str(where / "tracker")]
    monkeypatch.setenv("KIT_TRACKER_DIR", str(job / "tracker"))
    trackers.remember_mlflow_run("0123456789abcdef0123456789abcdef", "file:/x")
    env = {"KIT_SCRIPTS_DIR": str(job), "KIT_JOB_DIR": str(job), "KIT_START_STEP": "40"}
    assert run_bash(fns + show, env).split()[3:5] == ["0123456789abcdef0123456789abcdef", "40"]
    mine = {**env, "WANDB_RUN_ID": "mine", "WANDB_RESUME": "must", "MLFLOW_RUN_ID": "theirs"}
    assert run_bash(fns + show, mine).split()[:4] == ["mine", job.name, "must", "theirs"]
    # MLflow 3 refuses a file store unless MLFLOW_ALLOW_FILE_STORE says yes: a job naming one gets it.
    allow = 'kit::tracker_env\necho "${MLFLOW_ALLOW_FILE_STORE-unset}"\n'
    for uri, user, seen in (
        ("file:/x/mlruns", None, "true"),
        ("/x/mlruns", None, "true"),
        ("sqlite:///x.db", None, "unset"),
        (None, None, "unset"),
        ("file:/x", "false", "false"),
    ):
        given = {
            **env,
            **({"MLFLOW_TRACKING_URI": uri} if uri else {}),
            **({"MLFLOW_ALLOW_FILE_STORE": user} if user else {}),
        }
        assert run_bash(fns + allow, given).strip() == seen, (uri, user)
    assert job.name == "train-20261125-000000-abcdef" and JobDir(task).tracker_run_id == f"{job.name}-t3"


def test_a_requeue_after_a_restart_in_the_allocation_numbers_the_run_past_both_and_catches_up_the_killed_one(
    tmp_path,
):
    """Run 0 hung and was restarted in its allocation; run 1 died with its node and Slurm requeued the job
    (SLURM_RESTART_COUNT=1): the batch script's run is 2 (Slurm's count plus the restart in the allocation), and
    run 1, which left no record, is recorded killed, so that every run has its line and none is numbered twice."""
    import json

    runs = tmp_path / "runs.jsonl"
    runs.write_text(
        json.dumps(
            {
                "run": 0,
                "end": "hang",
                "exit_code": 1,
                "checkpoint_step": 4,
                "advanced": True,
                "time": 1,
                "then": "restart",
            }
        )
        + "\n"
    )
    fns = bash_functions(
        "kit::begin_run", "kit::restarted_here", "kit::read_run", "kit::_append_run", "kit::catch_up_runs"
    )
    out = run_bash(
        fns
        + "declare -A KIT_RECORD=()\nkit::_checkpoint_step() { echo 4; }\n"
        + 'kit::begin_run "$(( SLURM_RESTART_COUNT + $(kit::restarted_here) ))"\nkit::catch_up_runs\n'
        + 'echo "$KIT_RESTART $KIT_PROGRESS_DIR $KIT_START_STEP"\n',
        {"KIT_RUNS_FILE": str(runs), "SLURM_RESTART_COUNT": "1", "KIT_JOB_DIR": "/j"},
    )
    assert out.split() == ["2", "/j/progress/r2", "4"]
    assert [(r["run"], r["end"]) for r in map(json.loads, runs.read_text().splitlines())] == [
        (0, "hang"),
        (1, "killed"),
    ]
