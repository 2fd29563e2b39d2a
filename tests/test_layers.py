"""Each room has one job: the scheduler-neutral core imports nothing that knows
Slurm, pyxis, the local cluster or the launch room (issue 12)."""

from __future__ import annotations

import ast
from pathlib import Path

KIT = Path(__file__).resolve().parent.parent / "kit"
OUTSIDE_THE_CORE = ("kit.slurm", "kit.cluster", "kit.launch", "kit.cli", "kit.monitor", "kit.image", "kit.train")


def imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_the_core_knows_no_scheduler_and_no_container_runtime():
    for path in sorted((KIT / "core").glob("*.py")):
        bad = sorted(n for n in imports(path) if n.startswith(OUTSIDE_THE_CORE))
        assert bad == [], f"{path.relative_to(KIT.parent)} imports {bad}"
        assert "kit import slurm" not in path.read_text()


def test_the_cluster_config_renders_without_daemons_or_slurm():
    """kit/cluster/config.py is pure rendering: golden files pin it."""
    bad = sorted(n for n in imports(KIT / "cluster" / "config.py") if n.startswith(("kit.slurm", "kit.runner",
                                                                                      "subprocess")))
    assert bad == []
