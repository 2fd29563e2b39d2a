"""The local cluster's directory: what `up` writes into it and `down` clears (the rendering
of each file is :mod:`kit.cluster.config`'s)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from kit import files
from kit.cluster import accounting, config, plugin, processes, state
from kit.cluster import public as public_


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
    """The cluster's directory for ``st``: its directories, munge key, GPU device files (0700: its owner's
    alone); beside ``conf``, what every client reads: slurm.conf, the plugin stack, gres.conf (0644), and
    slurmdbd.conf (0600)."""
    r, public = root, conf.parent
    os.chmod(r, 0o700)  # the cluster's config, state and logs are its owner's alone
    public_.make(root)
    for sub in ("log", "run", "state"):
        (r / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(r / sub, 0o700)
    # slurmd's spool (each job's user runs its batch script from it) and munged's socket: every user's.
    shared = [public / "spool", *(public / "spool" / f"node{i}" for i in range(1, st.nodes + 1))]
    for d in shared + ([config.munge_socket(public).parent] if st.auth == "munge" else []):
        d.mkdir(exist_ok=True)
        os.chmod(d, 0o755)
    if st.auth == "munge":
        (r / "munge").mkdir(mode=0o700, exist_ok=True)
        key = r / "munge" / "munge.key"
        if not key.exists():  # a new key per cluster, readable by its owner alone
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(1024))
    write_plugstack(r, st)
    if st.containers == config.PYXIS:
        plugin.write_enroot_wrappers(public, st.nodes)
    files.write_atomic(
        public / "prolog", config.prolog(public, st.containers == config.PYXIS, r / "prometheus" / "regen"), 0o755
    )
    for gpu in config.gpu_files(st, r):
        gpu.parent.mkdir(parents=True, exist_ok=True)
        gpu_device(gpu)
    files.write_atomic(public / "gres.conf", config.gres_conf(st, r), 0o644)
    if st.dbd_port:
        accounting.write(r, st, processes.user(), config.auth_lines(st, public), public)
    files.write_atomic(conf, config.slurm_conf(st, r, processes.user(), state.next_job_id(root), public), 0o644)


def write_plugstack(root: Path, st) -> None:
    """plugstack.conf for ``st`` beside slurm.conf (every client reads it; each new step's slurmstepd too:
    a mode change needs no restart)."""
    so = plugin.plugin_of(root, st) if st.containers else None
    public = public_.of(root)
    files.write_atomic(
        public / "plugstack.conf",
        config.plugstack_conf(st.containers, root, so, st.squashfuse, st.container_scope, public),
        0o644,
    )


def clean(root: Path, state_file: Path) -> None:
    """Remove the cluster's runtime state and its clients' directory; the next job id is kept (ids are
    never reused)."""
    public = public_.of(root)
    if public != root:
        files.remove_tree(public)
    next_id = max(state.saved_job_id_sequence(root / "state" / "job_state"), state.next_job_id(root))
    if next_id > 1:
        (root / "next_job_id").write_text(f"{next_id}\n")
    for sub in ("state", "spool", "run", "dev", "prometheus", config.TARGETS, "enroot", "munge"):  # enroot: named
        files.remove_tree(root / sub)
    for path in (state_file,):
        path.unlink(missing_ok=True)
