"""Turning a job spec into a job directory and an sbatch submission.

:func:`prepare` validates nothing itself (give it a :class:`ResolvedJob`); it
writes the job directory atomically: ``prelaunch.sh``, ``launcher.sh``,
``job.json`` (the resolved spec) and ``sbatch.json`` (the exact argv).
:func:`submit` hands it to sbatch and records the job id.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from kit import __version__, slurm
from kit.core import bash
from kit.core.spec import ResolvedJob
from kit.errors import KitError
from kit.launch import sidecars


@dataclass
class PreparedJob:
    job: ResolvedJob
    job_dir: Path
    sbatch_argv: list[str]
    job_id: str | None = None

    def as_json(self) -> dict:
        return {"job_id": self.job_id, "job_dir": str(self.job_dir), "sbatch_argv": self.sbatch_argv}


def render_scripts(job: ResolvedJob, job_dir: Path) -> dict[str, str]:
    """The text of prelaunch.sh and launcher.sh for ``job`` living in ``job_dir``."""
    s = job.spec
    lib = bash.template("lib.sh").rstrip("\n")
    given = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name in s.env]
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in s.env]
    master_setup = ("unset " + " ".join(missing)) if missing else ""
    if given:
        master_setup += ("\n" if master_setup else "") + "# " + " and ".join(given) + " come from --env."
    prelaunch = bash.render(bash.template("prelaunch.sh"), {
        "kit_version": __version__,
        "lib": lib,
        "job_dir": bash.quote(job_dir),
        "max_restarts": str(s.max_restarts),
        "heartbeat": str(s.heartbeat),
        "port_low": str(job.port_low),
        "port_high": str(job.port_high),
        "master_interface": bash.quote(s.master_interface or ""),
        "srun_args": bash.array(slurm.srun_args(job)),
        "signal": bash.quote(s.signal),
        "debug": "1" if s.debug else "0",
        "env_exports": bash.exports(s.env) or ":  # none given",
        "master_setup": master_setup,
    })
    launcher = bash.render(bash.template("launcher.sh"), {
        "kit_version": __version__,
        "lib": lib,
        "rank_exports": slurm.rank_exports(),
        "command": bash.array(s.command),
        "sidecars": bash.array(sidecars.as_words(sidecars.for_job(s.sidecars))),
    })
    return {"prelaunch.sh": prelaunch, "launcher.sh": launcher}


def _new_job_dir(out_dir: Path, job_name: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in job_name)[:40].strip(".") or "job"
    return out_dir / f"{safe}-{stamp}-{secrets.token_hex(3)}"


def prepare(job: ResolvedJob, *, job_dir: Path | None = None) -> PreparedJob:
    """Write the job directory (all or nothing) and return what to submit."""
    out_dir = Path(job.spec.output_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise KitError(f"cannot create {out_dir}: {e.strerror}", field="--output-dir") from None
    final = job_dir or _new_job_dir(out_dir, job.spec.job_name)
    argv = slurm.sbatch_argv(job, final)
    tmp = final.with_name(f".{final.name}.tmp")
    try:
        (tmp / "logs").mkdir(parents=True)
        for name, text in render_scripts(job, final).items():
            path = tmp / name
            path.write_text(text, encoding="utf-8")
            path.chmod(0o755)
        (tmp / "job.json").write_text(json.dumps(job.spec.to_dict(), indent=2, sort_keys=True) + "\n")
        (tmp / "sbatch.json").write_text(json.dumps(argv, indent=2) + "\n")
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return PreparedJob(job=job, job_dir=final, sbatch_argv=argv)


def submit(prepared: PreparedJob, target: slurm.Target) -> PreparedJob:
    """Submit with sbatch --parsable; on failure the job directory is removed."""
    try:
        job_id = slurm.submit(target, prepared.sbatch_argv)
    except BaseException:
        shutil.rmtree(prepared.job_dir, ignore_errors=True)
        raise
    prepared.job_id = job_id
    (prepared.job_dir / "job_id").write_text(job_id + "\n")
    return prepared


SITE_CONFS = ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf", "/run/slurm/conf/slurm.conf")


def select_target(where: str | None) -> tuple[slurm.Target, str | None]:
    """Which Slurm to submit to: ``"local"``, ``"site"`` or None (decide).

    Undecided, the site's Slurm wins when one is configured (``SLURM_CONF`` or
    a slurm.conf in the usual places); otherwise kit's local cluster, when it
    runs. Returns the target and a note for the user (or None).
    """
    from kit.cluster import LocalCluster

    local = LocalCluster()
    if where == "local":
        if not local.running():
            raise KitError("the local cluster is not running", field="--local",
                           hint="start it with: kit cluster up --nodes 2")
        return local.target, None
    site_conf = os.environ.get("SLURM_CONF") or next((p for p in SITE_CONFS if os.path.exists(p)), None)
    if where == "site" or site_conf:
        return slurm.Target(conf=None, name="site"), None
    if local.running():
        return local.target, f"no site Slurm configured: using the local cluster ({local.conf})"
    raise KitError("no Slurm to submit to: no site slurm.conf and no local cluster",
                   hint="start one with `kit cluster up`, or use --dry-run to only write the scripts")
