"""Each room has one job: the scheduler-neutral core imports nothing that knows
Slurm, pyxis, the local cluster or the launch room (issue 12)."""

from __future__ import annotations

import ast
from pathlib import Path

KIT = Path(__file__).resolve().parent.parent / "kit"
OUTSIDE_THE_CORE = ("kit.slurm", "kit.cluster", "kit.submission", "kit.cli", "kit.monitor", "kit.image", "kit.train")


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


# ------------------------------------------------------------------ issue 21: the layer rules in code
BOTTOM = ("kit.errors", "kit.files", "kit.home", "kit.jobdir")  # modules every layer may use


def package_of(module: str) -> str | None:
    """``kit.submission.sidecars`` -> ``kit.submission``; bottom-layer modules and ``kit`` itself -> None."""
    if not module.startswith("kit.") or module.startswith(BOTTOM):
        return None
    return ".".join(module.split(".")[:2])


def kit_imports(path: Path) -> set[str]:
    """The kit modules ``path`` imports (``from kit import x`` counted as ``kit.x``)."""
    return {n for n in imports(path) if n.startswith("kit.") and not n.rsplit(".", 1)[-1].startswith("__")}


def packages_imported(pkg: str) -> dict[str, set[str]]:
    """{module path: other kit packages it imports} for every module of ``kit/<pkg>``."""
    assert (KIT / pkg / "__init__.py").is_file(), f"no package kit/{pkg}: a rule about it would hold vacuously"
    out = {}
    for path in sorted((KIT / pkg).rglob("*.py")):
        others = {package_of(n) for n in kit_imports(path)} - {None, f"kit.{pkg}"}
        # `from kit import files` names a bottom module through the package root.
        out[str(path.relative_to(KIT.parent))] = {o for o in others if o not in BOTTOM}
    return out


def test_the_core_imports_only_the_bottom_layer():
    assert {p: o for p, o in packages_imported("core").items() if o} == {}


def test_submission_does_not_know_the_local_cluster():
    """Target choice lives in kit/targets.py: kit/submission writes and submits a job for any Slurm."""
    assert {p: o for p, o in packages_imported("submission").items() if "kit.cluster" in o} == {}


def test_the_image_builder_knows_neither_slurm_nor_launch():
    assert {p: o & {"kit.slurm", "kit.submission"} for p, o in packages_imported("image").items()
            if o & {"kit.slurm", "kit.submission"}} == {}


def test_the_exporter_carries_nothing_of_kit_but_the_bottom_layer():
    """kit/monitor runs inside images (from /opt/kit) beside the training: it imports only itself
    and the bottom layer (errors, files, home, jobdir); `kit report` lives in kit/report."""
    assert {p: o for p, o in packages_imported("monitor").items() if o} == {}


def test_the_bottom_layer_imports_only_itself():
    paths = [KIT / "errors.py", KIT / "files.py", KIT / "home.py", *sorted((KIT / "jobdir").glob("*.py"))]
    for path in paths:
        bad = {n for n in kit_imports(path) if not n.startswith(BOTTOM)}
        assert bad == set(), f"{path.relative_to(KIT.parent)} imports {bad}"


def test_no_module_imports_a_private_name_from_another_package():
    bad = []
    for path in sorted(KIT.rglob("*.py")):
        pkg = ".".join(("kit", *path.relative_to(KIT).parts[:1])).removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kit"):
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    private = a.name.startswith("_") and not a.name.startswith("__")
                    if private and package_of(full) != package_of(pkg + ".x"):
                        bad.append(f"{path.relative_to(KIT.parent)}: {full}")
    assert bad == []


def test_the_rules_can_fail():
    """The checks above see a forbidden import when there is one (a test that cannot fail is a defect)."""
    assert package_of("kit.cluster.config") == "kit.cluster" and package_of("kit.files") is None
    assert "kit.cluster" in {package_of(n) for n in kit_imports(KIT / "targets.py")}


# Sizes a reader can hold in mind (issue 21). A module or function past them needs a line
# here saying why; none does today.
LONG_MODULES: dict[str, str] = {}
LONG_FUNCTIONS: dict[str, str] = {}


def test_no_module_over_400_lines_and_no_function_over_80():
    long_modules, long_functions = [], []
    for path in sorted(KIT.rglob("*.py")):
        rel = str(path.relative_to(KIT.parent))
        text = path.read_text()
        if text.count("\n") > 400 and rel not in LONG_MODULES:
            long_modules.append(f"{rel}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > 80 and f"{rel}:{node.name}" not in LONG_FUNCTIONS:
                    long_functions.append(f"{rel}:{node.name}: {length} lines")
    assert long_modules == [] and long_functions == []


def test_every_package_ships():
    """pyproject's package list names every package under kit/ (a wheel would miss one it does not)."""
    import tomllib

    listed = set(tomllib.loads((KIT.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(KIT.parent).parts) for p in KIT.rglob("__init__.py")}
    assert found - listed == set()
