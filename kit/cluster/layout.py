"""The local cluster's directory: what `up` writes into it and `down` clears (the rendering
of each file is :mod:`kit.cluster.config`'s)."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from kit import files
from kit.cluster import accounting, config, plugin, processes, state


def gpu_device(path: Path) -> None:
    """A GPU's device file for gres.conf: Slurm 22.05 binds (CUDA_VISIBLE_DEVICES,
    SLURM_STEP_GPUS) only GPUs whose File= is a character device. As root, one with
    /dev/null's numbers (harmless to open); otherwise a plain file, counted but not bound."""
    if path.exists():
        return
    if os.geteuid() == 0:
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            return
        except OSError:
            pass
    path.touch()


def write(root: Path, conf: Path, st) -> None:
    """The cluster's directory for ``st``: its directories, munge key, plugin stack, GPU device
    files, gres.conf and slurm.conf (0700: its owner's alone)."""
    r = root
    os.chmod(r, 0o700)  # the cluster's config, state and logs are its owner's alone
    for sub in ("log", "run", "state", *(f"spool/node{i}" for i in range(1, st.nodes + 1))):
        (r / sub).mkdir(parents=True, exist_ok=True)
    if st.auth == "munge":
        (r / "munge").mkdir(mode=0o700, exist_ok=True)
        key = r / "munge" / "munge.key"
        if not key.exists():  # a new key per cluster, readable by its owner alone
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(1024))
    write_plugstack(r, st)
    if st.containers == config.PYXIS:
        plugin.write_enroot_wrappers(r, st.nodes)
    for gpu in config.gpu_files(st, r):
        gpu.parent.mkdir(parents=True, exist_ok=True)
        gpu_device(gpu)
    (r / "gres.conf").write_text(config.gres_conf(st, r))
    if st.dbd_port:
        accounting.write(r, st, processes.user(), config.auth_lines(st, r))
    files.write_atomic(conf, config.slurm_conf(st, r, processes.user(), state.next_job_id(root)))


def write_plugstack(root: Path, st) -> None:
    """plugstack.conf for ``st`` (each new step's slurmstepd reads it: a mode change needs no restart)."""
    so = plugin.plugin_of(root, st) if st.containers else None
    files.write_atomic(root / "plugstack.conf", config.plugstack_conf(st.containers, root, so, st.squashfuse,
                                                                      st.container_scope))


def clean(root: Path, state_file: Path) -> None:
    """Remove the cluster's runtime state; the next job id is kept (ids are never reused)."""
    next_id = max(state.saved_job_id_sequence(root / "state" / "job_state"), state.next_job_id(root))
    if next_id > 1:
        (root / "next_job_id").write_text(f"{next_id}\n")
    for sub in ("state", "spool", "run", "dev", "prometheus", "enroot", "munge"):  # enroot: named containers too
        shutil.rmtree(root / sub, ignore_errors=True)
    for path in (state_file,):
        path.unlink(missing_ok=True)
