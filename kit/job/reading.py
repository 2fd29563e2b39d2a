"""What a job's records tell, as :class:`kit.Job` methods: its report, its goodput and its events — read from the
job directory here, or made on the login node for a job there (:mod:`kit.job.hosting`)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from kit import slurm
from kit.job import sides
from kit.job.hosting import data, data_list, hosted
from kit.jobdir import JobDir
from kit.jobdir import events as events_lib
from kit.jobdir import goodput as goodput_lib


class Reading:
    """The reading half of :class:`kit.job.handle.Job` (``dir``, ``id``, ``there`` and ``state()`` are its)."""

    @hosted(**data(goodput_lib.Goodput))
    def goodput(self) -> goodput_lib.Goodput | None:
        """How much of the job's time trained and where the rest went (kit.jobdir.goodput): its wall time from
        submission to now (or its end) in parts; None before its first run began."""
        state = self.state() if self.id is not None else "ENDED"
        return goodput_lib.goodput(self.dir, running=state not in slurm.TERMINAL_STATES | {"ENDED"})

    @hosted(**data_list(events_lib.Event))
    def events(self) -> list[events_lib.Event]:
        """What happened to the job, in order, across its runs (kit.jobdir.events): `kit events`."""
        return events_lib.events(self.dir)

    @hosted(serve=sides.summarize_there, laptop=sides.summarize_here)
    def summarize(
        self,
        prometheus: str | None = None,
        output: str | Path | None = None,
        min_seconds: float | None = None,
        notice=lambda e: None,
    ):
        """What `kit report` prints and writes: a single job's summary (``.lines()``), or an array
        job's table of tasks; the picture at ``output`` (default: the job directory's report.png),
        its numbers beside it (report.json); ``notice`` hears what could not be drawn. (On a login node the
        report is made there, its picture written here; ``output_dir=`` says where a job id is looked up.)"""
        from kit.cluster import LocalCluster
        from kit.report import MIN_SECONDS, report_job

        return report_job(
            self.dir,
            self.id or self.dir.name,
            Path(output) if output else self.dir / JobDir.REPORT,
            prometheus or LocalCluster().prometheus_url(),
            MIN_SECONDS if min_seconds is None else min_seconds,
            notice,
        )

    @hosted(laptop=sides.report_here)
    def report(self, prometheus: str | None = None, **kwargs: Any) -> dict:
        """The numbers of `kit report` (report.json's), the picture written beside them."""
        return asdict(self.summarize(prometheus, **kwargs))
