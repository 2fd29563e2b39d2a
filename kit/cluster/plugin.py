"""Container jobs on the local cluster: real pyxis + enroot when both are installed, else
kit's stand-in SPANK plugin (spank/*.c, one file per context), compiled against Debian's libslurm-dev."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from kit import files
from kit.cluster import config
from kit.cluster import public as public_
from kit.errors import KitError
from kit.runner import run

PYXIS_PATHS = (
    "/usr/local/lib/slurm/spank_pyxis.so",
    "/usr/lib/x86_64-linux-gnu/slurm/spank_pyxis.so",
    "/usr/lib64/slurm/spank_pyxis.so",
    "/usr/lib/slurm/spank_pyxis.so",
)


def pyxis_plugin() -> str | None:
    """Path of an installed pyxis (KIT_PYXIS_PLUGIN, or the usual places)."""
    for path in (os.environ.get("KIT_PYXIS_PLUGIN"), *PYXIS_PATHS):
        if path and os.path.exists(path):
            return path
    return None


def prepare(root: Path, progress) -> str | None:
    """Real pyxis when it and enroot are installed, else kit's stand-in, built now into the cluster's public
    directory (srun and sbatch load it too)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    choice = config.choose_containers(
        pyxis_plugin(), shutil.which("enroot"), cc is not None and Path("/usr/include/slurm/spank.h").exists()
    )
    if choice == config.PYXIS:
        progress(
            f"container jobs: pyxis ({pyxis_plugin()}), enroot ({shutil.which('enroot')}), "
            f"each node with its own enroot paths under {public_.of(root) / 'enroot'}"
        )
        return choice
    if choice is None:
        progress(
            "container jobs disabled: building kit's pyxis stand-in needs gcc and "
            "libslurm-dev (apt-get install -y gcc libslurm-dev)"
        )
        return None
    public_.make(root)
    out = public_.of(root) / "spank_kit_pyxis.so"
    sources = sorted(str(c) for c in (Path(__file__).parent / "spank").glob("*.c"))
    run(
        [cc, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(out), *sources],
        what="cluster",
        hint="the stand-in SPANK plugin did not compile",
    )
    progress("container jobs: kit's pyxis stand-in (no pyxis/enroot here)")
    return "kit-pyxis"


def description(root: Path, st) -> str:
    """Which plugin runs container jobs, and in which mode (``kit cluster status``)."""
    if st is None or not st.containers:
        return "none (kit's stand-in needs gcc and libslurm-dev; real pyxis needs enroot too)"
    if st.containers == config.PYXIS:
        which = f"pyxis {plugin_of(root, st)}, each node with its own enroot paths under {public_.of(root) / 'enroot'}"
    else:
        which = f"kit's pyxis stand-in {plugin_of(root, st)} (no pyxis and enroot installed)"
    return f"{which}; {mode_description(st.squashfuse, st.container_scope)}"


def mode_description(squashfuse: bool, scope: str = "global") -> str:
    if squashfuse:
        mode = (
            "squashfuse mode (use_squashfuse=1: images started from the squashfs, read through squashfuse "
            "under an overlay, never unpacked)"
        )
    else:
        mode = "create mode (each node unpacks the image before the step: enroot create)"
    if scope == "job":
        mode += (
            "; container_scope=job (named containers are the job's, removed by the job epilog: kit names "
            "create-mode containers so that their removal is out of the job's steps)"
        )
    return mode


SCOPES = ("global", "job")  # pyxis's container_scope
# pyxis's job epilog runs enroot with this PATH (pyxis_slurmd.c, job_epilog_fixup).
EPILOG_PATH = ("/usr/local/bin", "/usr/bin", "/bin")


def choose_mode(squashfuse: bool | None, scope: str | None, st) -> tuple[bool, str]:
    """(squashfuse, container scope) for ``kit cluster up``: as given, else as running, else create mode and
    pyxis's global scope; squashfuse mode's tools checked."""
    fuse = squashfuse if squashfuse is not None else bool(st and st.squashfuse)
    if fuse:
        check_squashfuse()
    scope = scope or (st.container_scope if st else "global")
    if scope not in SCOPES:
        raise KitError(f"expected one of {', '.join(SCOPES)}, got {scope!r}", field="--container-scope")
    return fuse, scope


def check_scope(containers: str | None, scope: str) -> None:
    """container_scope=job with real pyxis needs an enroot its job epilog finds (on EPILOG_PATH, configured
    for this cluster's per-node directories: .ci/real-pyxis installs one); without it every job's epilog
    would fail, and Slurm drain the node."""
    if scope != "job" or containers != config.PYXIS:
        return
    if not any(os.access(os.path.join(d, "enroot"), os.X_OK) for d in EPILOG_PATH):
        raise KitError(
            f"pyxis's job epilog runs enroot from {':'.join(EPILOG_PATH)}, and none is there",
            field="--container-scope",
            exit_code=1,
            hint="install enroot there as a site does (.ci/real-pyxis does, with the per-node paths "
            "of kit's cluster in its enroot.conf.d), or keep --container-scope global",
        )


# enroot's default (ENROOT_NATIVE_OVERLAYFS) and the stand-in lay a kernel overlay over the
# squashfuse mount; fuse-overlayfs is needed only where a site turns that off.
FUSE_TOOLS = ("squashfuse",)


def check_squashfuse() -> None:
    """What squashfuse mode needs on the nodes, or one error that names what to install."""
    lacking = [tool for tool in FUSE_TOOLS if shutil.which(tool) is None]
    if lacking or not os.path.exists("/dev/fuse"):
        raise KitError(
            f"{', '.join(lacking) or '/dev/fuse'} not found",
            field="--squashfuse",
            exit_code=1,
            hint="squashfuse mode reads images through FUSE: apt-get install -y squashfuse",
        )


def plugin_of(root: Path, st) -> str | None:
    """The plugin ``st`` was started with (a state from before it was recorded: found again)."""
    if st.container_plugin:
        return st.container_plugin
    return pyxis_plugin() if st.containers == config.PYXIS else str(public_.of(root) / "spank_kit_pyxis.so")


def write_enroot_wrappers(public: Path, nodes: int) -> None:
    """Real pyxis: each node's enroot directory where every user reaches it (root's: the prolog makes each
    job user's own in it), the wrapper first on its slurmd's PATH."""
    enroot = shutil.which("enroot")
    config.pyxis_runtime(public).mkdir(parents=True, exist_ok=True)
    for i in range(1, nodes + 1):
        wrapper = config.enroot_bin(public, f"node{i}") / "enroot"
        wrapper.parent.mkdir(parents=True, exist_ok=True)
        files.write_atomic(wrapper, config.enroot_wrapper(public, f"node{i}", enroot), 0o755)
