"""Which Slurm a job goes to: the site's, or kit's local cluster.

The one place that knows both, so that ``kit/submission`` need not know the local
cluster: the commands and the job-following code (``kit ps``, ``kit logs``,
``kit cancel``) ask here. :func:`plan` is the launch's first library call: the
target is chosen *before* the job is resolved and validated, so everything that
depends on it (the local cluster's Prometheus targets directory) is checked
like anything the user typed.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from kit import files, slurm
from kit import submission as lib
from kit.core import spec as specs
from kit.errors import KitError
from kit.jobdir import JobDir, records

SITE_CONFS = ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf", "/run/slurm/conf/slurm.conf")
LOCAL_TARGETS_LABEL = "the local cluster's Prometheus targets directory"


def plan(
    spec: specs.JobSpec,
    origins: specs.Origins | None = None,
    *,
    where: str | None = None,
    dry_run: bool = False,
    cwd: Path | None = None,
    rerun: lib.Rerun | None = None,
) -> lib.Plan:
    """Choose the target (none for a dry run), then :func:`kit.submission.plan` the job for it
    (``rerun``: what a rerun keeps)."""
    origins = origins or specs.Origins()
    if dry_run:
        return lib.plan(spec, origins, cwd=cwd, rerun=rerun)
    target, note = select_target(where, needs_containers=bool(spec.image))
    if spec.prometheus_targets is None and spec.exporter is not False:
        local = local_prometheus_targets(target)
        if local is not None:
            spec = dataclasses.replace(spec, prometheus_targets=local)
            origins = specs.Origins({**origins, "prometheus_targets": LOCAL_TARGETS_LABEL})
    return lib.plan(spec, origins, target=target, target_note=note, cwd=cwd, rerun=rerun)


def local_prometheus_targets(target: slurm.Target) -> str | None:
    """This user's directory in a local cluster's Prometheus targets (file_sd), when the job goes to one that runs
    Prometheus: the caller's own (``--local``), or root's, which every local user of the machine shares (its
    slurm.conf in /run/kit). The directory is theirs, made by the cluster's Prolog; Prometheus labels each of its
    targets ``owner`` with their name."""
    from kit.cluster import LocalCluster, config, processes, public

    if target.name == "local":
        shared = LocalCluster().prometheus_targets
    elif target.conf and Path(target.conf).resolve().parent.parent == public.MACHINE:
        shared = Path(target.conf).resolve().parent / config.TARGETS  # beside its slurm.conf, as LocalCluster's
    else:
        return None
    if not shared.is_dir():  # made when its Prometheus starts
        return None
    return str(shared / processes.user())


def _trusted(path: Path) -> bool:
    """``path`` is owned by this user or root and no one else can change it: what it says
    may decide which programs kit runs (a Slurm configuration names plugins Slurm loads)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return st.st_uid in (0, os.geteuid()) and not st.st_mode & 0o022


def target_of(job_dir: Path) -> slurm.Target:
    """The Slurm a submitted job (or array task) went to (recorded at submission), else the usual choice.

    The record is followed only when the job directory, its ``slurm.json`` and the
    configuration it names belong to this user or root and no one else can change
    them: root running ``kit ps``/``cancel`` over a shared directory must not load a
    configuration (and the plugins it names) another user planted."""
    where = records.submission_dir(job_dir)
    record = where / JobDir.SLURM
    try:
        with files.open_regular(record) as (fd, st):
            owner_ok = st.st_uid in (0, os.geteuid()) and not st.st_mode & 0o022 and _trusted(where)
            rec = files.loads(os.read(fd, 1 << 16).decode("utf-8", errors="replace"))
    except (OSError, ValueError):
        return select_target(None)[0]
    conf = rec.get("conf") if isinstance(rec, dict) else None
    name = rec.get("target") if isinstance(rec, dict) else None
    if conf is not None and (not isinstance(conf, str) or "\0" in conf):
        raise KitError(f"{record}: damaged: 'conf' is not a path", field="job")
    if conf is not None and (not owner_ok or not _trusted(Path(conf))):
        raise KitError(
            f"{record}: not trusted: it names the Slurm configuration {conf!r}, and it or that file "
            "belongs to another user or can be changed by one",
            field="job",
            hint="run kit as the job's owner; root follows only records and configurations owned by root or itself",
        )
    return slurm.Target(conf=conf, name=str(name or "site"))


def unavailable(target: slurm.Target) -> str | None:
    """Why ``target`` cannot answer, when that is known without asking it
    (Slurm's commands retry a missing slurm.conf for 60 s, a dead controller for 10)."""
    if target.conf is None:
        return None
    conf = Path(target.conf)
    if not conf.is_file():
        return f"its slurm.conf {conf} is gone"
    from kit.cluster import LocalCluster, public

    if target.name == "local" and not LocalCluster(public.home_of(conf)).controller_alive():
        return "the local cluster is not running"
    return None


def select_target(where: str | None, needs_containers: bool = False) -> tuple[slurm.Target, str | None]:
    """Which Slurm to submit to: ``"local"``, ``"site"`` or None (decide).

    Undecided, the site's Slurm wins when one is configured (``SLURM_CONF`` or
    a slurm.conf in the usual places); otherwise kit's local cluster, when it
    runs. Returns the target and a note for the user (or None).
    """
    from kit.cluster import LocalCluster, public

    local = LocalCluster()

    def local_target() -> slurm.Target:
        state = local.state()
        if needs_containers and state is not None and not state.containers:
            raise KitError(
                "the local cluster was started without container support",
                field="--image",
                hint="install gcc and libslurm-dev, then: kit cluster down && kit cluster up",
            )
        return local.target

    if where == "local":
        if not local.running():
            raise KitError(
                "the local cluster is not running", field="--local", hint="start it with: kit cluster up --nodes 2"
            )
        return local_target(), None
    env_conf = os.environ.get("SLURM_CONF") or None
    if where is None and env_conf and os.path.realpath(env_conf) == os.path.realpath(local.conf):
        # A shell that ran `eval "$(kit cluster env)"`: that is the local cluster.
        if not local.running():
            raise KitError(
                f"SLURM_CONF names the local cluster's {env_conf}, which is not running",
                hint="start it with: kit cluster up",
            )
        return local_target(), None
    site_conf = env_conf or next((p for p in SITE_CONFS if os.path.exists(p)), None)
    if where == "site" or site_conf:
        # SLURM_CONF is recorded with the job: later commands, from any shell, ask the same Slurm.
        return slurm.Target(conf=env_conf, name="site"), None
    if local.running():
        return local_target(), f"no site Slurm configured: using the local cluster ({local.conf})"
    machine = public.clusters() if os.geteuid() != 0 else []  # root's own cluster is `local`
    if machine:
        # Root's local cluster serves every user of the machine, as a site's Slurm does: a login shell through
        # `ssh host cmd` has no SLURM_CONF from dotfiles that return before their exports.
        several = (
            f" — the newest of {len(machine)} running (`kit cluster status` lists them; "
            'eval "$(kit cluster env --id ID)" chooses one)'
            if len(machine) > 1
            else ""
        )
        return (
            slurm.Target(conf=str(machine[0]), name="site"),
            f"no site Slurm configured: using this machine's local cluster ({machine[0]}){several}",
        )
    if os.geteuid() != 0:
        raise KitError(
            "no Slurm to submit to: no slurm.conf in SLURM_CONF or the usual places "
            f"({', '.join(SITE_CONFS)}), and no local cluster runs on this machine",
            hint="set SLURM_CONF to your site's slurm.conf (its admins know where it is), or use "
            "--dry-run to only write the scripts",
        )
    raise KitError(
        "no Slurm to submit to: no site slurm.conf and no local cluster",
        hint="start one with `kit cluster up`, or use --dry-run to only write the scripts",
    )
