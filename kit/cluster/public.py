"""The client side of a local cluster: what every user of it reads (slurm.conf and the files beside it,
munged's socket). A site keeps it in /etc/slurm; root's local cluster keeps it in /run/kit/cluster-<id>
(its own directory, under ~root, is 0700 and stays so: state, logs, the munge key, the database)."""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import stat
from pathlib import Path

from kit.errors import KitError

MACHINE = Path("/run/kit")


def of(root: Path) -> Path:
    """Where the cluster at ``root`` keeps what its clients read: for root's cluster a directory every
    local user can reach, whatever the path of root's own; for another user's, its own directory."""
    if os.geteuid() != 0:
        return root
    return MACHINE / f"cluster-{hashlib.sha256(str(root).encode()).hexdigest()[:12]}"


HOME = "kit-home"  # in a cluster's public directory: the KIT_HOME whose cluster it is


def home_of(conf: Path) -> Path:
    """The KIT_HOME of the local cluster whose slurm.conf is ``conf``: its own directory's parent, or for
    root's cluster the one its public directory names (a file of root's, as the directory checks)."""
    if conf.parent.parent != MACHINE:
        return conf.parent.parent
    try:
        return Path((conf.parent / HOME).read_text().strip())
    except OSError:
        return conf.parent.parent


def make(root: Path) -> None:
    """The cluster at ``root``'s public directory (and /run/kit) as directories of root's that every user can
    enter and none other can change: one that is not (a symlink, another owner's, writable by others) is
    refused."""
    public = of(root)
    if public == root:
        return
    for d in (public.parent, public):
        try:
            d.mkdir(mode=0o755)
        except FileExistsError:
            pass
        st = os.lstat(d)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise KitError(
                f"{d} is not a directory of root's that only root can change: the cluster's clients "
                "would read their configuration from it",
                field="cluster",
                hint=f"remove {d}",
            )
        os.chmod(d, 0o755)
    (public / HOME).write_text(f"{root.parent}\n")


def clusters() -> list[Path]:
    """The slurm.conf of every root's local cluster on this machine, newest first: files of root's in
    directories of root's that no one else can change (others' are not believed)."""
    found = []
    for conf in MACHINE.glob("cluster-*/slurm.conf"):
        try:
            checked = [os.lstat(p) for p in (MACHINE, conf.parent, conf)]
        except OSError:
            continue
        if all(st.st_uid == 0 and not st.st_mode & 0o022 and not stat.S_ISLNK(st.st_mode) for st in checked):
            found.append((checked[2].st_mtime, conf))
    return [conf for _, conf in sorted(found, reverse=True)]


def cluster_id(conf: Path) -> str:
    """The id a person chooses a local cluster of this machine by: its public directory's (``cluster-ID``)."""
    return conf.parent.name.removeprefix("cluster-")


def _shells(env_conf: str | None, conf: Path) -> bool:
    return bool(env_conf) and os.path.realpath(env_conf) == os.path.realpath(conf)


def elsewhere(own_conf: Path, env_conf: str | None = None) -> list[str]:
    """For ``kit cluster status`` when the caller's own cluster is not running: root's local clusters of this
    machine, when they run (every local user's), newest first, the one the shell's SLURM_CONF names marked, and
    how a login shell uses one."""
    found = [conf for conf in clusters() if conf != own_conf]
    if not found:
        return []
    if len(found) == 1:
        return [
            f"this machine's local cluster (root's, every local user's): SLURM_CONF={shlex.quote(str(found[0]))}; "
            f'use it with: eval "$(kit cluster env)"'
        ]
    lines = [f"this machine's local clusters (root's, every local user's), {len(found)} running, newest first:"]
    for conf in found:
        mark = " (your shell's SLURM_CONF)" if _shells(env_conf, conf) else ""
        lines.append(f"  {cluster_id(conf)}  SLURM_CONF={shlex.quote(str(conf))}{mark}")
    lines.append('use one with: eval "$(kit cluster env --id ID)"')
    return lines


def serving(own_conf: Path, own_running: bool, env_conf: str | None = None, chosen: str | None = None):
    """The local cluster a login shell here uses, and a note for the person (or None): the one ``chosen`` by id;
    else the caller's own when it runs; else root's on this machine that the shell's SLURM_CONF (``env_conf``)
    names; else root's newest — said so when several run (a shell moved onto another's cluster unawares)."""
    found = clusters()
    if chosen is not None:
        ids = {cluster_id(conf): conf for conf in found}
        if own_running:
            ids.setdefault(cluster_id(own_conf), own_conf)
        if chosen not in ids:
            raise KitError(
                f"no local cluster {chosen!r} runs on this machine",
                field="--id",
                hint=f"running: {', '.join(ids) or 'none'} (kit cluster status lists them)",
            )
        return ids[chosen], None
    if own_running:
        return own_conf, None
    named = [conf for conf in found if _shells(env_conf, conf)]
    if named:
        return named[0], None
    if not found:
        raise KitError(
            "no local cluster runs on this machine",
            field="cluster",
            hint="root starts one for every local user with `kit cluster up`; yours: the same",
        )
    note = None
    if len(found) > 1:
        others = ", ".join(cluster_id(conf) for conf in found[1:])
        note = (
            f"kit: note: {len(found)} local clusters run on this machine: using the newest, {cluster_id(found[0])} "
            f"(others: {others}); choose one with `kit cluster env --id ID`"
        )
    return found[0], note


def login_lines(conf: Path) -> list[str]:
    """What a login shell needs to use the local cluster of `conf` (``kit cluster env``): its SLURM_CONF, and
    PATH where Slurm's commands are not on a login shell's."""
    lines = [f"export SLURM_CONF={shlex.quote(str(conf))}"]
    sbatch = shutil.which("sbatch")
    if sbatch and os.path.dirname(sbatch) not in ("/usr/local/bin", "/usr/bin", "/bin"):
        lines.append(f'export PATH={shlex.quote(os.path.dirname(sbatch))}:"$PATH"')
    return lines
