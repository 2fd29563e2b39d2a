"""Each room has one job: the scheduler-neutral core imports nothing that knows
Slurm, pyxis, the local cluster or the launch room."""

from __future__ import annotations

import ast
import functools
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


def test_the_command_line_knows_of_remote_only_its_host_option():
    """kit/cli/ parses and prints: over --host, group.py routes the command (kit.remote's client and transfer);
    on the login node a launch answers its laptop with one framed record (kit.remote.wire). No other command
    knows a transport: `kit --host … report` is Job.summarize on a job that has a host, like any other call."""
    knows = {p.name: sorted(n for n in imports(p) if n.startswith("kit.remote")) for p in (KIT / "cli").glob("*.py")}
    routers = {"group.py", "launch.py", "serving.py"}
    assert {name: names for name, names in knows.items() if names and name not in routers} == {}
    assert set(knows["launch.py"]) <= {"kit.remote", "kit.remote.wire"}, knows["launch.py"]


def test_the_cluster_config_renders_without_daemons_or_slurm():
    """kit/cluster/config.py is pure rendering: golden files pin it."""
    bad = sorted(
        n for n in imports(KIT / "cluster" / "config.py") if n.startswith(("kit.slurm", "kit.runner", "subprocess"))
    )
    assert bad == []


# ------------------------------------------------------------------ the layer rules in code
BOTTOM = ("kit.errors", "kit.files", "kit.home", "kit.jobdir", "kit.stopping")  # modules every layer may use


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
    assert {
        p: o & {"kit.slurm", "kit.submission"}
        for p, o in packages_imported("image").items()
        if o & {"kit.slurm", "kit.submission"}
    } == {}


def test_the_exporter_carries_nothing_of_kit_but_the_bottom_layer():
    """kit/monitor runs inside images (from /opt/kit) beside the training: it imports only itself
    and the bottom layer (errors, files, home, stopping, jobdir); `kit report` lives in kit/report."""
    assert {p: o for p, o in packages_imported("monitor").items() if o} == {}


def test_the_bottom_layer_imports_only_itself():
    paths = [
        KIT / "errors.py",
        KIT / "files.py",
        KIT / "home.py",
        KIT / "stopping.py",
        *sorted((KIT / "jobdir").glob("*.py")),
    ]
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


# Sizes a reader can hold in mind. A module or function past them needs a line
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


# ------------------------------------------------------------------ the whole import graph
# Every kit module sits in a layer; an import may go to its own package or to a lower (or the same)
# layer, never higher, and the graph of modules has no circle. A module names the layer of the
# longest prefix listed here; one that matches none is an error (a new room is placed on purpose).
LAYERS: tuple[tuple[str, ...], ...] = (
    # no kit import at all
    ("kit.version", "kit.errors", "kit.files", "kit.home", "kit.stopping"),
    # processes; the job directory's names
    ("kit.runner", "kit.jobdir"),
    # the job model (and text as a terminal shows it); the exporter (runs in images)
    ("kit.core", "kit.monitor"),
    ("kit.notify", "kit.preflight", "kit.image", "kit.train"),
    # the code a job runs; kit report; Slurm
    ("kit.code", "kit.report", "kit.slurm"),
    # a job written and submitted; the local cluster
    ("kit.submission", "kit.cluster"),
    # where a job goes
    ("kit.targets",),
    # the jobs: their handle and methods, the launch, function jobs, listing, logs, trim (no transport)
    ("kit.job",),
    # kit ui; a login node through ssh (the transport a job there carries; kit there)
    ("kit.ui", "kit.remote"),
    # the one face: kit.launch, kit.Job, ... here or with host=
    ("kit.api",),
    # the commands (and kit there's); `kit` re-exports the face lazily
    ("kit.cli", "kit.__main__", "kit"),
)


def layer_of(module: str) -> int:
    best = None
    for rank, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and (best is None or len(p) > len(best[1])):
                best = (rank, p)
    assert best is not None, f"{module} is in no layer of tests/test_layers.py's LAYERS"
    return best[0]


def room_of(module: str) -> str:
    """The package a module belongs to (``kit.slurm.status`` -> ``kit.slurm``; ``kit.files`` -> itself)."""
    return ".".join(module.split(".")[:2])


def module_names(root: Path) -> dict[str, Path]:
    out = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if path.name != "__init__.py":
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _known(name: str, modules: dict) -> str:
    """The longest known module that ``name`` (a module or a name inside one) starts with."""
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def import_edges(module: str, path: Path, modules: dict) -> tuple[set[str], list[str]]:
    """(the kit modules ``module`` imports, the private names of other rooms it reads).

    Counts imports at any depth (inside functions too), absolute and relative, ``importlib.import_module``
    and ``__import__`` with a literal name, and a module reached as an attribute of an imported one
    (``import kit`` then ``kit.job.handle.launch_with``)."""
    return _edges(module, path.name == "__init__.py", path.read_text(), frozenset(modules))


@functools.lru_cache(maxsize=None)
def _edges(module: str, is_package: bool, text: str, modules: frozenset) -> tuple[set[str], list[str]]:
    path = Path("__init__.py" if is_package else "module.py")
    edges, private, bound = set(), [], {}
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "kit":
                    edges.add(_known(a.name, modules))
                    bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else "kit"
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, path, node)
            if base.split(".")[0] != "kit":
                continue
            for a in node.names:
                target = _known(f"{base}.{a.name}", modules)
                edges.add(target)
                if target == f"{base}.{a.name}":
                    bound[a.asname or a.name] = target
                if a.name.startswith("_") and not a.name.startswith("__") and room_of(target) != room_of(module):
                    private.append(f"{module}: {base}.{a.name}")
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in ("import_module", "__import__") and str(node.args[0].value).startswith("kit"):
                edges.add(_known(str(node.args[0].value), modules))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                chain.insert(0, value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in bound:
                dotted = bound[value.id]
                for part in chain:
                    if f"{dotted}.{part}" not in modules:
                        if part.startswith("_") and not part.startswith("__") and room_of(dotted) != room_of(module):
                            private.append(f"{module}: {dotted}.{part}")
                        break
                    dotted = f"{dotted}.{part}"
                    edges.add(dotted)
    return edges - {module}, private


def import_graph(root: Path = KIT) -> tuple[dict[str, set[str]], list[str]]:
    modules = module_names(root)
    graph, private = {}, []
    for module, path in modules.items():
        graph[module], p = import_edges(module, path, modules)
        private += p
    return graph, private


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component of more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer_violations(root: Path = KIT) -> list[str]:
    """Every circle, every upward import and every private name read across rooms, in words."""
    graph, private = import_graph(root)
    bad = [f"circle: {' -> '.join(c)}" for c in cycles(graph)]
    for module, targets in sorted(graph.items()):
        for t in sorted(targets):
            if room_of(t) != room_of(module) and layer_of(t) > layer_of(module):
                bad.append(f"upward: {module} (layer {layer_of(module)}) imports {t} (layer {layer_of(t)})")
    return bad + [f"private: {p}" for p in private]


def test_the_import_graph_has_no_circle_and_nothing_imports_upward():
    assert layer_violations() == []


def room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph by folder (room): which other rooms each room's modules import."""
    rooms: dict[str, set[str]] = {}
    for module, targets in graph.items():
        rooms.setdefault(room_of(module), set()).update(room_of(t) for t in targets)
    return {room: targets - {room} for room, targets in rooms.items()}


def test_each_folder_is_one_floor_and_no_two_folders_import_each_other():
    """The rule holds for folders as well as modules: LAYERS places rooms (folders, top-level modules), never a
    module of a folder on a floor of its own, and the rooms' graph has no circle (two folders that import each
    other are one). A circle of rooms made of modules that form none is still refused."""
    assert [p for prefixes in LAYERS for p in prefixes if p != room_of(p)] == []
    graph, _ = import_graph()
    assert cycles(room_graph(graph)) == []
    planted = {"kit.code.trim": {"kit.job.listing"}, "kit.job.respec": {"kit.code.snapshot"}}  # no module circle
    assert cycles(planted) == [] and cycles(room_graph(planted)) == [["kit.code", "kit.job"]]


PLANTED = {  # file -> a line planted at its end, each one a kind of import the rule must refuse
    "kit/core/spec.py": "from ..slurm import commands as _planted",  # relative, upward
    "kit/image/info.py": "from kit import api as _planted",  # image -> api
    "kit/slurm/status.py": "import kit.cluster as _planted",  # slurm -> cluster
    "kit/image/recipe.py": "import importlib\n_planted = importlib.import_module('kit.submission')",
    "kit/jobdir/layout.py": "def _planted():\n    import kit.job.handle\n    return kit.job.handle",  # inside a function
    "kit/submission/sidecars.py": "from kit.slurm import status as _s\n_planted = _s._final_states",  # private attribute
    "kit/cluster/config.py": "from kit.cluster import layout as _planted",  # a circle in one room
    "kit/core/values.py": "from kit import __version__ as _planted",  # the root, from below
    "kit/report/series.py": "import kit\n_planted = kit.cli.report",  # a module as an attribute
    "kit/files.py": "_planted = __import__('kit.job.handle')",  # __import__
}


def test_each_planted_import_is_refused(tmp_path):
    """The rule sees each kind of forbidden import: planted one at a time in a copy of kit/."""
    import shutil

    copy = tmp_path / "kit"
    shutil.copytree(KIT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert layer_violations(copy) == []
    for rel, line in PLANTED.items():
        target = tmp_path / rel
        original = target.read_text()
        target.write_text(original + "\n" + line + "\n")
        try:
            assert layer_violations(copy) != [], f"{rel}: {line!r} was not refused"
        finally:
            target.write_text(original)


def where_things_live() -> list[tuple[list[str], list[str]]]:
    """docs/architecture.md's "Where things live" rows: (the paths of the first cell, the names in backticks of the second)."""
    import re

    text = (KIT.parent / "docs" / "architecture.md").read_text()
    table = text.split("# Where things live", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in table.splitlines():
        cells = line.split("|")
        if len(cells) < 4 or cells[1].strip() in ("where", "---"):
            continue
        rows.append((re.findall(r"`([^`]+)`", cells[1]), re.findall(r"`([^`]+)`", cells[2])))
    return rows


def test_the_readme_names_every_room_and_module_that_exists():
    """Each path of "Where things live" exists; each ``name.py`` (or ``dir/name.c``) a row names is a file in one
    of that row's directories; and every package and top-level module of kit/ is in some row."""
    rows = where_things_live()
    assert len(rows) >= 10
    named = set()
    for paths, names in rows:
        for p in paths:
            assert (KIT.parent / p).exists(), f"docs/architecture.md names {p}: no such path"
            named.add(p.rstrip("/"))
        dirs = {KIT.parent / p if p.endswith("/") else (KIT.parent / p).parent for p in paths}
        for n in names:
            if n.endswith((".py", ".c", ".sh")) and " " not in n:
                found = (KIT.parent / n).is_file() or any((d / n).is_file() for d in dirs)
                assert found, f"docs/architecture.md row {paths} names {n}: in none of {sorted(map(str, dirs))}"
    rooms = {f"kit/{p.name}" for p in KIT.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    modules = {f"kit/{p.name}" for p in KIT.glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    assert rooms | modules <= named, f"not in docs/architecture.md's table: {sorted((rooms | modules) - named)}"


def test_every_package_opens_with_what_it_owns():
    """Every package's __init__.py and every top-level module starts with a docstring (its room's one line)."""
    for path in [*KIT.rglob("__init__.py"), *KIT.glob("*.py")]:
        assert ast.get_docstring(ast.parse(path.read_text())), (
            f"{path.relative_to(KIT.parent)} has no opening docstring"
        )


def test_every_test_that_starts_a_cluster_is_marked():
    """`-m 'not cluster'` runs no test that starts Slurm daemons: a test whose own code starts a local
    cluster (``LocalCluster(...).up``, ``kit cluster up`` that succeeds) carries the ``cluster`` mark, by its
    fixtures (conftest marks ``cluster`` and ``three``), a decorator or its module's ``pytestmark``."""
    import re

    starts = re.compile(r"LocalCluster\([^)]*\)\.up\(|\bc\.up\(|\.up\(nodes=")
    bad = []
    for path in sorted((KIT.parent / "tests").glob("test_*.py")):
        text = path.read_text()
        tree = ast.parse(text)
        module_marked = re.search(r"^pytestmark = pytest\.mark\.cluster", text, re.M) is not None
        for node in tree.body:
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
                continue
            marked = (
                module_marked
                or {"cluster", "three"} & {a.arg for a in node.args.args}
                or any("mark.cluster" in ast.unparse(d) for d in node.decorator_list)
            )
            if starts.search(ast.get_source_segment(text, node)) and not marked:
                bad.append(f"{path.name}::{node.name}")
    assert bad == []


def test_no_command_module_shadows_a_name_the_cli_package_imports():
    """A submodule kit/cli/NAME.py, once imported, becomes the attribute NAME of kit.cli, replacing whatever
    kit/cli/__init__.py imported as NAME (kit.cli.remote once replaced kit.remote: every later main() failed)."""
    names = set()
    for node in ast.parse((KIT / "cli" / "__init__.py").read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kit"):
            names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    assert names and names & {p.stem for p in (KIT / "cli").glob("*.py")} == set()


def init_holds_code(path: Path) -> list[str]:
    """What a package's ``__init__.py`` holds beyond a docstring, imports and ``__all__``: its main code."""
    bad = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__all__"]:
            continue
        bad.append(f"{path.relative_to(KIT.parent)}:{node.lineno}")
    return bad


def test_kit_says_what_it_holds():
    """At most 8 loose top-level modules; every package's __init__.py a short re-export with no main code (kit's
    own: the lazy re-export of the API that keeps `import kit` light)."""
    loose = sorted(p.name for p in KIT.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(loose) <= 8, loose
    inits = [p for p in sorted(KIT.rglob("__init__.py")) if p != KIT / "__init__.py"]
    assert [b for p in inits for b in init_holds_code(p)] == []
    assert all(p.read_text().count("\n") <= 60 for p in inits), [p for p in inits if p.read_text().count("\n") > 60]
    assert init_holds_code(KIT / "cluster" / "local.py")  # the check sees code where there is some


def test_each_fact_has_one_owner_and_no_text_names_a_tracker_number():
    """The default output directory is options.OUTPUT_DIR's alone, "was never submitted" is said in one place, a
    report's picture suffixes are one tuple; no module, bench or test says which issue it came from (say what)."""
    import re

    texts = {p: p.read_text() for p in sorted(KIT.rglob("*.py"))}
    assert [str(p) for p, t in texts.items() if '"kit-jobs"' in t] == [str(KIT / "core" / "options.py")]
    assert len([p for p, t in texts.items() if "was never submitted" in t]) == 1
    assert len([p for p, t in texts.items() if '(".png", ".svg", ".pdf")' in t]) == 1
    numbered = re.compile(r"\b[Ii]ssues? \d+")
    scanned = [*texts, *sorted((KIT.parent / "bench").rglob("*.py")), *sorted((KIT.parent / "tests").rglob("*.py"))]
    assert [str(p) for p in scanned if numbered.search(p.read_text())] == []
