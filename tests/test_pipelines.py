"""No generated script has a pipeline whose early reader can
fail it. Under `set -o pipefail` a reader that quits before its input ends (`head`, `grep -q`,
`awk '{…; exit}'`) makes its writer die of SIGPIPE whenever the writer writes again, and the
pipeline fails with 141 (FACTS.md: 9 of 2,000 times with three interfaces). A static check lists
every pipeline in launch/ with its readers; the lookups run 500 times each on a node with 40
addressed interfaces after the master's, `ip`'s lines arriving over time."""

from __future__ import annotations

import os
import re
import subprocess
import textwrap
from pathlib import Path

import pytest
from helpers import REPO, require

LAUNCH = REPO / "launch"
# Readers that may stop before their input ends, and so fail the pipeline under pipefail.
EARLY = [
    (re.compile(r"^head\b"), "head stops after its lines"),
    (re.compile(r"^grep\b.*\s-[a-zA-Z]*[qlm]"), "grep -q/-l/-m stops at a match"),
    (re.compile(r"^sed\b.*(\bq\b|[;{/]q)"), "sed q stops"),
    (re.compile(r"^awk\b(?!.*END\s*\{[^}]*exit)[^\n]*\bexit\b"), "awk exits before its input ends"),
]


def _unquoted(line: str) -> str:
    """``line`` with its comment dropped and single-quoted text blanked (awk and sed programs
    keep their words: what a reader does is read from them below)."""
    out, quote, i = [], None, 0
    while i < len(line):
        c = line[i]
        if quote == "'":
            out.append(c if c == "'" else "_" if c == "|" else c)
            quote = None if c == "'" else quote
        elif c == "'":
            quote = "'"
            out.append(c)
        elif c == "\\":
            out.append(line[i : i + 2].replace("|", "_"))
            i += 1
        elif c == "#" and (i == 0 or line[i - 1] in " \t;"):
            break
        else:
            out.append(c)
        i += 1
    return "".join(out)


ARITHMETIC = re.compile(r"\$?\(\((?:[^()]|\([^()]*\))*\)\)")
CASE = re.compile(r"^\s*[^()$]*\)|\bin\s+[^()]*\)")


def _bitwise(m: re.Match) -> str:
    """An arithmetic expression with its own ``|`` blanked, a command's inside it kept."""
    out, depth = [], 0
    text = m.group()
    for i, c in enumerate(text):
        if text.startswith("$(", i) and not text.startswith("$((", i):
            depth += 1
        elif c == ")" and depth:
            depth -= 1
        out.append("_" if c == "|" and depth == 0 else c)
    return "".join(out)


def pipelines(text: str) -> list[tuple[int, list[str]]]:
    """(line number, its stages) of every pipeline in a bash text."""
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        code = _unquoted(line)
        code = ARITHMETIC.sub(_bitwise, code)  # $(( a | b )): a bitwise or
        code = CASE.sub(lambda m: "_" * len(m.group()), code)  # a case pattern: a | b)
        bare = code.replace("||", "__")
        if "|" not in bare:
            continue
        stages, start = [], 0
        for i, c in enumerate(bare):
            if c == "|" and line[i] == "|":
                stages.append(line[start:i].strip())
                start = i + 1
        stages.append(line[start:].strip())
        found.append((n, stages))
    return found


def early_readers(stages: list[str]) -> list[str]:
    out = []
    for stage in stages[1:]:
        stage = re.sub(r"^[({\s]+", "", stage)
        for pattern, why in EARLY:
            if pattern.search(stage):
                out.append(f"{stage[:60]}: {why}")
    return out


def test_no_pipeline_in_launch_has_an_early_reader():
    listed, bad = [], []
    for path in sorted(LAUNCH.glob("*.sh")):
        for n, stages in pipelines(path.read_text()):
            listed.append(f"{path.name}:{n}: " + " | ".join(s[:40] for s in stages))
            bad += [f"{path.name}:{n}: {why}" for why in early_readers(stages)]
    print("\n".join(listed))  # every pipeline, listed (pytest -s shows it)
    assert len(listed) >= 10, listed  # the scan sees the scripts' pipelines
    assert bad == [], "\n".join(bad)


@pytest.mark.parametrize(
    "line",
    [
        """addr="$(ip -o -4 addr show | awk '{ split($4, a, "/"); print a[1]; exit }')\"""",
        """end="$(squeue --noheader | head -n 1)\"""",
        """if scontrol show job 1 | grep -q Requeue; then :; fi""",
        """x="$(cat f | sed -n '1p;q')\"""",
    ],
)
def test_the_check_catches_an_early_reader(line):
    assert [early_readers(stages) for _, stages in pipelines(line)] != [[]], line


def test_the_check_leaves_whole_readers_alone():
    text = textwrap.dedent("""\
        case "$x" in
          a | b) echo ;;
        esac
        n="$(sinfo | awk '{ n += $1 } END { print n + 0 }')"
        ok || true
        y="$(printf '%s' "$z" | sort -V | awk 'NR == 1')"
        if (( (a | b) - $(scontrol show hostnames "$x" | wc -l) > 0 )); then :; fi
        """)
    found = pipelines(text)
    assert [n for n, _ in found] == [4, 6, 7] and all(early_readers(s) == [] for _, s in found)


# ---------------------------------------------------------------- 40 interfaces after eth0
@pytest.fixture
def busy_node(tmp_path):
    """A network namespace like a real node: eth0 with the master's address (and a second one),
    then 40 addressed interfaces listed after it (veth pairs inside the namespace, high
    indexes: ib0, docker0 and bridges come after eth0), and an `ip` first on PATH whose
    lines arrive over time."""
    require("ip")
    ns = f"kit-pipes-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        script = [
            "ip link set lo up",
            "ip link add eth0 type veth peer name eth0p",
            "ip addr add 10.99.0.1/24 dev eth0",
            "ip addr add 10.99.1.1/24 dev eth0",
            "ip link set eth0 up",
            "ip link set eth0p up",
        ]
        for i in range(1, 41):
            script += [
                f"ip link add vx{i} index {5000 + i} type veth peer name vy{i} index {6000 + i}",
                f"ip addr add 10.100.{i}.1/24 dev vx{i}",
                f"ip link set vx{i} up",
                f"ip link set vy{i} up",
            ]
        subprocess.run(["ip", "netns", "exec", ns, "bash", "-ec", "\n".join(script)], check=True)
        slow = tmp_path / "bin"
        slow.mkdir()
        real = subprocess.run(["bash", "-c", "command -v ip"], capture_output=True, text=True).stdout.strip()
        (slow / "ip").write_text(
            f'#!/bin/bash\n{real} "$@" | while IFS= read -r line; do\n  printf \'%s\\n\' "$line"; sleep 0.002\ndone\n'
        )
        (slow / "ip").chmod(0o755)
        yield ns, slow
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


def run_in(ns: str, path: Path, body: str) -> str:
    """``body`` in bash on the node, strict mode, kit's lib.sh and prelaunch's lookup (its step part) loaded."""
    harness = textwrap.dedent("""\
        set -euo pipefail
        source {lib}
        kit::lib_init
        eval "$(sed -n '/^kit::_master_addr()/,/^}}/p' {prelaunch})"
        {body}
        """).format(lib=LAUNCH / "lib.sh", prelaunch=LAUNCH / "prelaunch_step.sh", body=body)
    proc = subprocess.run(
        ["ip", "netns", "exec", ns, "bash", "-c", harness],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{path}:{os.environ['PATH']}"},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


LOOP = """
ok=0 failed=0 wrong=0
for (( i = 0; i < 500; i++ )); do
  if got="$({call})"; then
    if [[ "${{got}}" == {want} ]]; then ok=$(( ok + 1 )); else wrong=$(( wrong + 1 )); fi
  else
    failed=$(( failed + 1 ))
  fi
done
echo "$ok $failed $wrong"
"""


def test_the_lookups_hold_500_times_with_40_interfaces_after_the_masters(busy_node):
    ns, slow = busy_node
    listed = run_in(ns, slow, "ip -o -4 addr show")
    names = [line.split()[1] for line in listed.splitlines()]
    assert names[:3] == ["lo", "eth0", "eth0"] and len(names) == 43  # eth0's two, then 40 more
    # The launcher's (GLOO_SOCKET_IFNAME): the interface that reaches MASTER_ADDR, without ip.
    for addr, want in (("10.99.0.1", "eth0"), ("10.100.7.9", "vx7"), ("10.100.40.200", "vx40")):
        assert run_in(
            ns, slow, LOOP.format(call=f'kit::route_iface {addr}; printf "%s" "${{KIT_ROUTE_IFACE}}"', want=want)
        ).split() == ["500", "0", "0"]
    # Prelaunch's, with --master-interface eth0 (two addresses: a line after the match).
    out = run_in(ns, slow, "readonly KIT_MASTER_IFACE=eth0\n" + LOOP.format(call="kit::_master_addr", want="10.99.0.1"))
    assert out.split() == ["500", "0", "0"], out
    # The pattern it replaced fails here: the check above can fail.
    old = "ip -o -4 addr show | awk -v a=10.99.1.1 '{ split($4, p, \"/\"); if (p[1] == a) { print $2; exit } }'"
    ok, failed, _ = run_in(ns, slow, LOOP.replace("500", "20").format(call=old, want="eth0")).split()
    assert int(failed) > 0, (ok, failed)
