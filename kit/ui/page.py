"""`kit ui`'s pages, as HTML text: the job list (`kit ps`'s rows and filters) and a job's page (its runs' timeline,
each rank's progress, the report's picture and notes, the batch log's tail, hang stacks). Plain HTML with its style
inline: no script, no asset from anywhere; every value escaped. A page of a job still running reloads itself."""

from __future__ import annotations

import html
import json
import time
import urllib.parse
from pathlib import Path

from kit import files
from kit.jobdir import JobDir, hangs
from kit.jobdir.events import events
from kit.jobdir.metrics import newest_rank_metrics
from kit.jobdir.runs import verdict_text
from kit.jobdir.slow_ranks import Straggler

REFRESH = 5  # seconds between reloads of a page that shows a running job
TAIL = 8192  # bytes of the batch log, of a hang's stacks
STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1b1f24;background:#fff}
h1{font-size:1.4em;margin:0 0 .3em}h2{font-size:1.1em;margin:1.4em 0 .4em;border-bottom:1px solid #d0d7de}
table{border-collapse:collapse}td,th{padding:.2em .7em;text-align:left;border-bottom:1px solid #eaeef2}
th{background:#f6f8fa}td.n{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#f6f8fa;padding:.6em;overflow-x:auto;font-size:12px;max-height:30em}
.RUNNING{color:#1a7f37}.PENDING{color:#9a6700}.FAILED,.TIMEOUT,.NODE_FAIL,.OUT_OF_MEMORY{color:#cf222e}
.CANCELLED{color:#6e7781}.alert{color:#cf222e}.warning{color:#9a6700}.muted{color:#6e7781}
img{max-width:100%;border:1px solid #d0d7de}form input{margin-right:.5em}
"""


def e(value: object) -> str:
    """A value as HTML text (the job's own files are text a page must not run)."""
    return html.escape("" if value is None else str(value), quote=True)


def document(title: str, body: str, refresh: bool = False) -> str:
    meta = f'<meta http-equiv="refresh" content="{REFRESH}">' if refresh else ""
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8">{meta}<title>{e(title)}</title>'
        f"<style>{STYLE}</style></head><body>{body}</body></html>"
    )


def _num(value: float | int | None, fmt: str = "{:.4g}") -> str:
    return "" if value is None else e(fmt.format(value))


def job_list(rows: list, query: dict[str, str], now: float) -> str:
    """The job list: what `kit ps` shows (its filters in a form), each job linking to its page."""
    head = "JOB NAME STATE RUN STEP LOSS SAMPLES/S NODES SUBMITTED".split()
    lines = []
    for r in rows:
        step = "" if r.step is None else f"{r.step}" + (f"/{r.max_steps}" if r.max_steps else "")
        age = "" if r.submitted is None else f"{(now - r.submitted) / 60:.0f} min ago"
        lines.append(
            f'<tr><td><a href="/job/{urllib.parse.quote(r.id)}">{e(r.id)}</a></td><td>{e(r.name)}</td>'
            f'<td class="{e(r.state)}">{e(r.state)}</td><td class="n">{r.run}</td><td class="n">{e(step)}</td>'
            f'<td class="n">{_num(r.loss)}</td><td class="n">{_num(r.samples_per_second, "{:.1f}")}</td>'
            f"<td>{e(r.nodes)}</td><td>{e(age)}</td></tr>"
        )
    fields = "".join(
        f'<label>{e(k)} <input name="{k}" value="{e(query.get(k, ""))}" size="10"></label>'
        for k in ("state", "name", "since", "user")
    )
    form = f'<form method="get">{fields}<label><input type="checkbox" name="all" value="1"'
    form += f"{' checked' if query.get('all') else ''}> all</label> <button>filter</button></form>"
    table = f"<table><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>{''.join(lines)}</table>" if rows else ""
    empty = "" if rows else '<p class="muted">no jobs (active, or submitted in the last 24 hours: tick "all")</p>'
    body = f"<h1>kit jobs</h1>{form}{table}{empty}"
    return document("kit jobs", body, refresh=any(r.active for r in rows))


def job_page(row, job_dir: Path, now: float) -> str:
    """A job's page: the row's numbers, then what its directory records."""
    parts = [
        f'<p><a href="/">all jobs</a></p><h1>job {e(row.id)} <span class="muted">{e(row.name)}</span></h1>',
        _summary(row, now),
        _timeline(job_dir),
        _ranks(job_dir, now),
        _report(row, job_dir),
        _hangs(job_dir),
        _log_tail(job_dir, row.id),
    ]
    return document(f"kit job {row.id}", "".join(parts), refresh=row.active)


def _rate_is(row) -> str:
    """What the row's samples/s is: the ranks' latest while the job runs, the job's throughput once it ended."""
    if row.samples_per_second is None:
        return ""
    if row.duration_seconds is not None:
        return " (the job's: every rank's samples over its steps' time)"
    return " (now: every rank's latest, summed)"


def _summary(row, now: float) -> str:
    cells = [
        (
            "state",
            f'<span class="{e(row.state)}">{e(row.state)}</span>' + (f" ({e(row.reason)})" if row.reason else ""),
        ),
        ("run", e(row.run)),
        ("step", e(row.step) + (f" of {e(row.max_steps)}" if row.max_steps else "")),
        ("loss", _num(row.loss)),
        ("samples/s", _num(row.samples_per_second, "{:.1f}") + _rate_is(row)),
        (
            "duration",
            "-" if row.duration_seconds is None else f"{row.duration_seconds:.1f} s from submission to its end",
        ),
        ("nodes", e(row.nodes)),
        ("directory", e(row.job_dir)),
    ]
    cells.insert(-2, ("goodput", "n/a" if row.goodput is None else f"{100 * row.goodput:.1f}% of its time trained"))
    if row.stragglers:
        cells.append(("stragglers", "<br>".join(e(_straggler(s)) for s in row.stragglers)))
    if row.preflight:
        cells.append(("preflight", e(verdict_text(row.preflight))))
    return "<table>" + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in cells) + "</table>"


def _straggler(named: dict) -> str:
    """A straggler as kit report and kit events say it (its rank and node first)."""
    try:
        return Straggler(**named).line()
    except TypeError:  # a record of another version
        return f"rank {named.get('rank')} on {named.get('node')}: {named.get('evidence', '')}"


def _timeline(job_dir: Path) -> str:
    got = events(job_dir)
    if not got:
        return ""
    since = got[0].time
    lines = "".join(
        f'<tr><td class="n">{e(f"+{ev.time - since:.1f} s")}</td><td>{"" if ev.run is None else ev.run}</td>'
        f"<td>{e(ev.kind)}</td><td>{e(ev.text)}</td></tr>"
        for ev in got
    )
    start = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since))
    return (
        f"<h2>Timeline <span class='muted'>from {e(start)}</span></h2><table><tr><th>at</th><th>run</th>"
        f"<th>event</th><th></th></tr>{lines}</table>"
    )


def _ranks(job_dir: Path, now: float) -> str:
    ranks = newest_rank_metrics(job_dir)
    if not ranks:
        return ""
    rows = []
    for rank in sorted(ranks):
        node, v = ranks[rank]
        seen = v.get("last_step_timestamp_seconds") or 0.0
        rows.append(
            f'<tr><td class="n">{rank}</td><td>{e(node)}</td><td class="n">{_num(v.get("step"), "{:.0f}")}</td>'
            f'<td class="n">{_num(v.get("loss"))}</td><td class="n">{_num(v.get("samples_per_second"), "{:.1f}")}</td>'
            f'<td class="n">{e(f"{max(now - seen, 0):.0f} s ago") if seen else ""}</td></tr>'
        )
    head = "".join(f"<th>{h}</th>" for h in ("rank", "node", "step", "loss", "samples/s", "last step"))
    return f"<h2>Ranks</h2><table><tr>{head}</tr>{''.join(rows)}</table>"


def _report(row, job_dir: Path) -> str:
    picture = job_dir / JobDir.REPORT
    if not picture.is_file():
        return f'<h2>Report</h2><p class="muted">none yet: <code>kit report {e(row.id)}</code> draws it</p>'
    try:
        summary = json.loads(files.read_text(picture.with_suffix(".json"), 1 << 22))
        notes = [n for n in summary.get("notes", []) if isinstance(n, dict)]
    except (OSError, ValueError, AttributeError):
        notes = []
    items = "".join(f'<li class="{e(n.get("level"))}">{e(n.get("text"))}</li>' for n in notes)
    src = f"/job/{urllib.parse.quote(row.id)}/{JobDir.REPORT}"
    return f'<h2>Report</h2><img src="{src}" alt="the report of job {e(row.id)}">' + (
        f"<ul>{items}</ul>" if items else ""
    )


def _hangs(job_dir: Path) -> str:
    out = []
    for h in hangs(job_dir):
        stacks = _tail(Path(h["stacks"])) if h["stacks"] else ""
        who = f"rank {h['rank']} on {h['node']}" if h["rank"] != "unknown" else "no rank named"
        out.append(
            f"<details open><summary>run {e(h['run'])}: {e(who)}: {e(h['summary'])}</summary><pre>{e(stacks)}</pre>"
            "</details>"
        )
    return "<h2>Hangs</h2>" + "".join(out) if out else ""


def _log_tail(job_dir: Path, job_id: str) -> str:
    logs = JobDir(job_dir).batch_logs()
    if not logs:
        return ""
    return f"<h2>Batch log <span class='muted'>the end of {e(logs[-1].name)}</span></h2><pre>{e(_tail(logs[-1]))}</pre>"


def _tail(path: Path) -> str:
    try:
        return files.tail(path, TAIL).decode("utf-8", errors="replace")
    except OSError:
        return ""
