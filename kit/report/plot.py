"""The report's pictures (matplotlib, the `report` extra): a job's panels, an array's loss curves."""

from __future__ import annotations

import os
from pathlib import Path

from kit import files as kit_files
from kit.errors import KitError
from kit.home import kit_home
from kit.report.many import banded
from kit.report.series import GAP, GIB, Logs, Series, _of, rates, sample_rates
from kit.report.summary import Summary

PICTURES = (".png", ".svg", ".pdf")  # what a report's picture may be written as


def picture_suffix(output: str | Path | None) -> str:
    """``output``'s suffix (``.png`` when none is given), checked: a report is a picture."""
    suffix = Path(output).suffix.lower() if output else ".png"
    if suffix not in PICTURES:
        raise KitError(
            f"{output}: the report is a picture: name it .png, .svg or .pdf",
            field="--output",
            hint="a .json summary is written next to it",
        )
    return suffix


def _panels(series: Series) -> list[tuple[str, list[tuple[str, list, dict]]]]:
    """The panels that have data: (title, [(label, points, style)])."""
    out = []

    def lines(metric: str, label, scale: float = 1.0) -> list:
        return [(label(k), [(t, v * scale) for t, v in pts], {}) for k, pts in _of(series, metric).items()]

    for metric, title in (
        ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (%)"),
        ("DCGM_FI_DEV_FB_USED", "GPU memory used (MiB)"),
        ("DCGM_FI_DEV_POWER_USAGE", "GPU power (W)"),
    ):
        out.append((title, lines(metric, lambda k: f"{k[1]} gpu{k[2]}")))
    cpu = [(f"{k[1]} job", rates(pts, resets=False), {}) for k, pts in _of(series, "kit_job_cpu_seconds_total").items()]
    cpu += [(f"{k[1]} allocated", pts, {"linestyle": "--"}) for k, pts in _of(series, "kit_job_cpus").items()]
    for node in sorted({k[1] for k in _of(series, "node_cpu_seconds_total")}):
        busy = [
            rates(pts)
            for k, pts in _of(series, "node_cpu_seconds_total", node).items()
            if k[2] not in ("idle", "iowait")
        ]
        if busy:
            cpu.append(
                (
                    f"{node} whole node",
                    [
                        (t, sum(r[i][1] for r in busy))
                        for i, (t, _) in enumerate(busy[0])
                        if all(len(r) > i for r in busy)
                    ],
                    {"linestyle": ":"},
                )
            )
    out.append(("CPU (cores busy)", cpu))
    mem = [
        (f"{k[1]} job", [(t, v / GIB) for t, v in pts], {})
        for k, pts in _of(series, "kit_job_memory_rss_bytes").items()
    ]
    mem += [
        (f"{k[1]} allocated", [(t, v / GIB) for t, v in pts], {"linestyle": "--"})
        for k, pts in _of(series, "kit_job_memory_limit_bytes").items()
    ]
    out.append(("Memory (GiB)", mem))
    out.append(("Training loss", lines("training_loss", lambda k: f"rank {k[2]}")))
    out.append(("Step time (s)", lines("training_step_duration_seconds", lambda k: f"rank {k[2]}")))
    out.append(("Model TFLOP/s per device", lines("training_tflops", lambda k: f"rank {k[2]}")))
    out.append(("MFU (of the device's peak)", lines("training_mfu", lambda k: f"rank {k[2]}")))
    out.append(
        (
            "Training throughput (samples/s)",
            [(f"rank {k[2]} ({k[1]})", sample_rates(series, k), {}) for k in _of(series, "training_samples_total")],
        )
    )
    return [(title, banded([c for c in curves if c[1]])) for title, curves in out if any(c[1] for c in curves)]


class NoPicture(KitError):
    """The picture cannot be drawn here (matplotlib, the `report` extra, is missing)."""


def _pyplot():
    """matplotlib's pyplot, drawing to files (Agg); NoPicture when it is not installed. Its font cache and
    configuration live under $KIT_HOME (``matplotlib/``), not in the home directory (MPLCONFIGDIR, unless set):
    kit writes nothing outside its own directories and the jobs' (a login node's home is the user's)."""
    if not os.environ.get("MPLCONFIGDIR"):
        mine = kit_home() / "matplotlib"
        try:
            mine.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.environ["MPLCONFIGDIR"] = str(mine)
        except OSError:
            pass  # matplotlib then finds a place of its own, as it does anywhere
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise NoPicture(
            "no picture: matplotlib is not installed",
            exit_code=1,
            hint="pip install 'kit-slurm[report]' (the numbers and report.json need nothing more)",
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def gapped(points: list) -> tuple[list, list]:
    """``points`` as (times, values) for a line, broken (a NaN) where two samples lie more than GAP seconds apart:
    samples that are missing are drawn as a gap, not bridged nor drawn as 0."""
    times, values = [], []
    for i, (t, v) in enumerate(points):
        if i and t - points[i - 1][0] > GAP:
            times.append((t + points[i - 1][0]) / 2)
            values.append(float("nan"))
        times.append(t)
        values.append(v)
    return times, values


def plot(series: Series, summary: Summary, out: Path, logs: Logs | None = None) -> None:
    """The job's picture in ``out``: a panel per metric with data (their titles in ``summary.panels``, drawn or
    not), the runs' restarts marked."""
    fig = figure(series, summary, logs)
    _save(fig, out)
    _pyplot().close(fig)


def figure(series: Series, summary: Summary, logs: Logs | None = None):
    """The job's picture (a matplotlib figure): :func:`plot` saves it."""
    panels = _panels(series)
    summary.panels = [title for title, _ in panels]
    plt = _pyplot()
    t0 = min((t for pts in series.values() for t, _ in pts), default=0.0)
    restarts = sorted((run, span[0]) for run, span in (logs.runs.items() if logs else ()) if run > 0)
    fig, axes = plt.subplots(
        max(len(panels), 1), 1, figsize=(13, 2.6 * max(len(panels), 1) + 0.6), sharex=True, squeeze=False
    )
    for ax, (title, curves) in zip(axes[:, 0], panels):
        for label, pts, style in curves:
            band = style.get("band")
            times, values = gapped(pts)
            drawn = {k: v for k, v in style.items() if k != "band"}
            if len(pts) == 1:  # one sample makes no line: a dot, not an empty panel
                drawn.setdefault("marker", "o")
            line = ax.plot([t - t0 for t in times], values, label=label, **drawn)
            if band:  # min to max of many nodes' curves, under their median
                ax.fill_between(
                    [t - t0 for t, _, _ in band],
                    [lo for _, lo, _ in band],
                    [hi for _, _, hi in band],
                    color=line[0].get_color(),
                    alpha=0.25,
                    linewidth=0,
                )
        for run, t in restarts:
            ax.axvline(t - t0, color="red", linewidth=0.8, alpha=0.7)
            if ax is axes[0, 0]:
                ax.annotate(  # inside the panel's top: never over its title
                    f" run {run}",
                    (t - t0, 0.98),
                    xycoords=("data", "axes fraction"),
                    color="red",
                    fontsize="small",
                    va="top",
                )
        ax.set_title(title)
        # Beside the panel, never over it: many nodes' labels ("61 nodes, whole node: median,
        # min to max") are wider than a panel's corner.
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    if not panels:
        axes[0, 0].set_axis_off()
    axes[-1, 0].set_xlabel("seconds since the first sample" + ("; red lines: restarts" if restarts else ""))
    fig.suptitle(f"kit job {summary.job}")
    # tight_layout leaves the job's title out of its sums: a band at the top is kept for it (half an inch).
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / fig.get_figheight()))
    return fig


def _save(fig, out: Path) -> None:
    """The figure as ``out`` (its format from the name), replaced atomically: a planted
    symlink at ``out`` is replaced, never followed."""
    with kit_files.replacing(out) as f:
        fig.savefig(f, dpi=80, format=out.suffix[1:].lower())


def _plot_tasks(plt, job: str, rows: list, curves: list, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(10, 6))
    drawn = False
    for row, curve in zip(rows, curves):
        if curve:
            t0 = curve[0][0]
            label = " ".join(f"{k}={v}" for k, v in row.params.items()) or f"task {row.task}"
            ax.plot([t - t0 for t, _ in curve], [v for _, v in curve], label=f"{row.task}: {label}")
            drawn = True
    ax.set_title(f"kit job {job}: training loss per task")
    ax.set_xlabel("seconds since the task's first sample")
    if drawn:
        ax.set_yscale("log")
        ax.legend(fontsize="small")
    else:
        ax.text(0.5, 0.5, "no training loss samples", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    _save(fig, out)
    plt.close(fig)
