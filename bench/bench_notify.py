"""Notifications and the job page, measured in one run.

    python bench/bench_notify.py [--quick] [--kit-home DIR] [--pages N] [--shots DIR]

1. A 2-node job of the reference trainer with --notify to a webhook on loopback, requeued twice by an admin
   (scontrol requeue) with slurmctld killed and started again in between (--quick: one run, no requeue): each
   event's time (its record's) to the webhook's receipt, median and worst (target: <= 5 s); duplicates (a key the
   webhook got twice) and losses (an event kit's timeline tells that never came), target 0 and 0.
2. `kit ui`'s job page, median of --pages loads: the running 2-node job's, and a running 64-node job's (one light
   rank a node on a throw-away 64-node local cluster; --quick: a 64-node job directory as a run leaves it), side by
   side, with their ratio, alternated: through its HTTP server (the whole answer), and in Debian's headless Chromium (from the
   navigation's start to its load event's end, as the browser's Navigation Timing tells it; target: <= 200 ms for 64
   nodes), where the page must show every rank. The job list's time beside them.

--kit-home DIR uses the local cluster already up there (the suite's); else a throw-away one of 2 nodes.
--shots DIR keeps Chromium's screenshot of each job page there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from common import on_cluster, wait_for  # noqa: E402

sys.path.insert(0, str(REPO / "tests"))
from cdp import Browser  # noqa: E402  (the tests' Chromium driver)

from kit import slurm  # noqa: E402
from kit.cluster import LocalCluster  # noqa: E402
from kit.jobdir import JobDir  # noqa: E402
from kit.jobdir.events import events  # noqa: E402
from kit.jobdir.metrics import write_rank_metrics  # noqa: E402
from kit.notify import deliver  # noqa: E402
from kit.ui import server  # noqa: E402

TRAIN = [sys.executable, "-m", "kit.train", "--step-delay", "0.05", "--checkpoint-every", "20", "--log-every", "100"]


class Webhook:
    """A loopback receiver: every POST's JSON body with its arrival time."""

    def __init__(self):
        self.got: list[tuple[dict, float]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                outer.got.append((json.loads(self.rfile.read(int(self.headers["Content-Length"]))), time.time()))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def launch(cluster: LocalCluster, out: Path, *args: str) -> tuple[str, Path]:
    proc = subprocess.run(
        [sys.executable, "-m", "kit", "launch", "--local", "--json", "--heartbeat", "0", "--output-dir", str(out), *args],
        capture_output=True, text=True, cwd=out.parent, env={**os.environ, "KIT_HOME": str(cluster.home)},
    )  # fmt: skip
    if proc.returncode:
        sys.exit(f"bench_notify: kit launch failed ({proc.returncode}): {proc.stderr.strip()}")
    job = json.loads(proc.stdout)
    return job["job_id"], Path(job["job_dir"])


def requeue(cluster: LocalCluster, job_id: str, restarts: int) -> None:
    """An admin's requeue, the next run started at once (not after Slurm's 121 s hold) once the last is gone."""
    env = {**os.environ, **cluster.target.env}
    subprocess.run(["scontrol", "requeue", job_id], env=env, check=True, capture_output=True)
    wait_for(lambda: slurm.job_status(cluster.target, job_id).restarts == restarts, 90, poll=0.5)
    stepd = f"slurmstepd: [{job_id}."
    wait_for(lambda: stepd not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout, 60)
    time.sleep(2)  # slurmd refuses a credential issued in the second its last one was revoked
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=env, capture_output=True)


def restart_controller(cluster: LocalCluster) -> None:
    os.kill(cluster.state().pids["slurmctld"], signal.SIGKILL)
    time.sleep(3)
    up = subprocess.run([sys.executable, "-m", "kit", "cluster", "up"], capture_output=True, text=True,
                        env={**os.environ, "KIT_HOME": str(cluster.home)})  # fmt: skip
    if up.returncode:
        sys.exit(f"bench_notify: kit cluster up failed: {up.stderr.strip()}")


def notify_job(cluster: LocalCluster, out: Path, quick: bool, hook: Webhook, ui: server.Ui, pages: int, shots) -> dict:
    steps = "100" if quick else "1500"
    job_id, job_dir = launch(cluster, out, "--nodes", "2", "--max-restarts", "3", "--notify", hook.url,
                             "--", *TRAIN, "--max-steps", steps)  # fmt: skip
    wait_for(lambda: len(list(job_dir.glob("metrics/*/rank-*.json"))) == 2, 120, poll=0.5)
    page_2 = page_times(ui, job_id, pages, shots and shots / "job-page-2-nodes.png")
    list_times = timed(lambda: ui.answer("/", {}), pages)
    if not quick:
        for n in (1, 2):
            wait_for(lambda: any(b["key"] == f"first-step:{n - 1}:0" for b, _ in hook.got), 120, poll=0.5)
            if n == 2:
                restart_controller(cluster)
            requeue(cluster, job_id, n)
    slurm.wait(cluster.target, job_id, timeout=600)
    wait_for(lambda: any(b["key"] == "ended" for b, _ in hook.got), 60, poll=0.5)
    time.sleep(2)  # a duplicate would have come by now
    keys = [b["key"] for b, _ in hook.got]
    told = [key for key, _ in deliver.keyed(events(job_dir))]
    latency = [at - b["time"] for b, at in hook.got]
    return {
        "runs": 1 if quick else 3,
        "events": len(keys),
        "duplicates": len(keys) - len(set(keys)),
        "losses": len(set(told) - set(keys)),
        "median": statistics.median(latency),
        "worst": max(latency),
        "page_2": page_2,
        "list": statistics.median(list_times),
    }


def timed(call, n: int) -> list[float]:
    out = []
    for _ in range(n):
        began = time.perf_counter()
        call()
        out.append(time.perf_counter() - began)
    return out


RANK_ROWS = (
    "[...document.querySelectorAll('tr')].filter(r => r.cells.length === 6 && r.cells[0].tagName === 'TD').length"
)
LOADED = "(() => { const e = performance.getEntriesByType('navigation')[0]; return e ? e.loadEventEnd - e.startTime : 0; })()"


@dataclass
class Page:
    """A job page's median load, through the HTTP server and in Chromium, and the rank rows Chromium showed."""

    http: float
    chromium: float | None = None
    ranks: int | None = None


def page_times(ui: server.Ui, job_id: str, n: int, shot: Path | None = None) -> Page:
    """The median load of the job's page, ``n`` of each alternated: through the server's HTTP path (the token's
    cookie, the whole answer), and in Chromium where there is one (navigation start to the load event's end);
    Chromium's screenshot to ``shot``."""
    running = server.start(ui)
    threading.Thread(target=running.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{running.server_address[1]}/job/{job_id}"
    request = urllib.request.Request(url, headers={"Cookie": server.cookie(running)})
    browser = Browser() if shutil.which("chromium") else None
    try:
        urllib.request.urlopen(request, timeout=30).read()  # the list's first look, as a person's first click
        if browser is not None:
            browser.open(server.address(running))  # the token exchanged for the cookie
        http, chromium = [], []
        for _ in range(n):
            http += timed(lambda: urllib.request.urlopen(request, timeout=30).read(), 1)
            if browser is not None:
                browser.go(url)
                chromium.append(wait_for(lambda: browser.evaluate(LOADED), 30, poll=0.01) / 1000)
        page = Page(statistics.median(http))
        if browser is not None:
            page.chromium, page.ranks = statistics.median(chromium), browser.evaluate(RANK_ROWS)
            if shot is not None:
                shot.write_bytes(browser.screenshot(1280, 1000))
        return page
    finally:
        if browser is not None:
            browser.close()
        running.shutdown()
        running.server_close()


def sixty_four_nodes(root: Path) -> str:
    """A 64-node job's directory as a run leaves it (as tests/test_ui.py's): its id."""
    d = root / "kit-64"
    progress = d / "progress" / "r0"
    progress.mkdir(parents=True)
    now = time.time()
    (d / JobDir.SPEC).write_text(json.dumps({"job_name": "wide", "nodes": 64}))
    (d / JobDir.JOB_ID).write_text("990064\n")
    os.utime(d / JobDir.JOB_ID, (now - 70, now - 70))  # submitted before it started
    (d / JobDir.SLURM).write_text(json.dumps({"conf": str(root / "no-such-slurm.conf")}))
    (progress / JobDir.STEP_START).write_text(f"{now - 60}\n")
    (progress / JobDir.TIMELINE.format(rank=0)).write_text(f"first {now - 50} 1\n")
    (d / JobDir.LOGS).mkdir()
    (d / JobDir.LOGS / JobDir.BATCH_LOG.format(job_id="990064")).write_text("[kit] run 0: 64 node(s)\n" * 200)
    for rank in range(64):
        node = f"node{rank + 1:02d}"
        (progress / JobDir.TASK.format(rank=rank)).write_text(f"{node} {1000 + rank} {now - 55}\n")
        values = {"step": 420.0, "loss": 2.5, "samples_per_second": 95.0, "last_step_timestamp_seconds": now}
        write_rank_metrics(d / JobDir.METRICS / node, rank, values)
    return "990064"


# The wide job's command: one light rank a node, reporting a step (8 samples) every half second.
LIGHT = "import time\nfrom kit.train import progress\nfor i in range(1, 10**6):\n    progress.step(i, samples=8)\n    time.sleep(0.5)\n"


def live_wide(nodes: int, pages: int, shot: Path | None) -> tuple[Page, float]:
    """The median load of a running ``nodes``-node job's page (a light rank a node, every rank's metrics written),
    on a throw-away local cluster of that many nodes; and of Slurm's answer for the job (one squeue), which kit ui
    asks for in the background (kit.ui.states), not while a page waits."""
    got = {}

    def measure(cluster: LocalCluster, tmp: Path) -> None:
        out = tmp / "jobs"
        out.mkdir()
        job_id, job_dir = launch(cluster, out, "--nodes", str(nodes), "--", sys.executable, "-c", LIGHT)
        try:
            wait_for(lambda: len(list(job_dir.glob("metrics/*/rank-*.json"))) == nodes, 600, poll=1)
            got["page"] = page_times(server.Ui((str(out),)), job_id, pages, shot)
            got["slurm"] = statistics.median(timed(lambda: slurm.statuses(cluster.target, [job_id]), pages))
        finally:
            subprocess.run(["scancel", job_id], env={**os.environ, **cluster.target.env}, capture_output=True)

    on_cluster("bench_notify (wide)", None, nodes, measure)
    return got["page"], got["slurm"]


def measure(cluster: LocalCluster, tmp: Path, quick: bool, pages: int, shots: Path | None) -> None:
    hook = Webhook()
    out = tmp / "jobs"
    out.mkdir()
    ui = server.Ui((str(out),))
    got = notify_job(cluster, out, quick, hook, ui, pages, shots)
    # --quick: a 64-node job's directory as a run leaves it; a full run: a running 64-node job on 64 nodes.
    shot = shots and shots / "job-page-64-nodes.png"
    page_64, slurm_64 = (
        (page_times(ui, sixty_four_nodes(out), pages, shot), None) if quick else live_wide(64, pages, shot)
    )
    page_2 = got["page_2"]
    print(f"notifications, a 2-node job, {got['runs']} run(s)" + ("" if quick else ", a slurmctld restart between"))
    print(f"{'measure':<56}{'value':>12}{'target':>12}")
    print(f"{'events delivered':<56}{got['events']:>12d}{'-':>12}")
    print(f"{'event -> webhook, median':<56}{got['median']:>11.2f}s{'-':>12}")
    print(f"{'event -> webhook, worst':<56}{got['worst']:>11.2f}s{'<= 5 s':>12}")
    print(f"{'duplicates':<56}{got['duplicates']:>12d}{'0':>12}")
    print(f"{'losses':<56}{got['losses']:>12d}{'0':>12}")
    print(f"{'job list (kit ui /), median of ' + str(pages):<56}{1000 * got['list']:>10.0f}ms{'-':>12}")
    wide = "64 nodes" + (" (a job directory)" if quick else " (running)")
    for how, target in (("http", "-"), ("chromium", "<= 200 ms")):
        if page_2.chromium is None and how == "chromium":
            print("job page in Chromium: not measured (no chromium here)")
            continue
        print(
            f"job page, {'its HTTP answer' if how == 'http' else 'in Chromium, to its load event'}, median of {pages}:"
        )
        print(f"{'  2 nodes (running)':<56}{1000 * getattr(page_2, how):>10.0f}ms{'-':>12}")
        print(f"{'  ' + wide:<56}{1000 * getattr(page_64, how):>10.0f}ms{target:>12}")
        print(f"{'  64 nodes / 2 nodes':<56}{getattr(page_64, how) / getattr(page_2, how):>11.2f}x{'-':>12}")
    if page_64.ranks is not None:
        print(
            f"{'rank rows Chromium showed, 2 nodes / 64 nodes':<56}{f'{page_2.ranks} / {page_64.ranks}':>12}{'2 / 64':>12}"
        )
    if slurm_64 is not None:
        print(f"{'Slurm answering for the 64-node job (in the background)':<56}{1000 * slurm_64:>10.0f}ms{'-':>12}")
    ready = page_64.chromium if page_64.chromium is not None else page_64.http
    shown = page_64.ranks in (None, 64) and page_2.ranks in (None, 2)
    met = got["worst"] <= 5 and got["duplicates"] == 0 and got["losses"] == 0 and ready <= 0.2 and shown
    print("targets met" if met else "TARGETS MISSED")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one run, no requeue; 5 page loads (the suite's run)")
    ap.add_argument("--kit-home", help="a KIT_HOME whose local cluster is up (default: a throw-away cluster)")
    ap.add_argument("--pages", type=int, default=None, help="page loads to take the median of [20; --quick 5]")
    ap.add_argument("--shots", type=Path, help="keep Chromium's screenshot of each job page in this directory")
    args = ap.parse_args()
    pages = args.pages or (5 if args.quick else 20)
    on_cluster(
        "bench_notify", args.kit_home, 2, lambda cluster, tmp: measure(cluster, tmp, args.quick, pages, args.shots)
    )


if __name__ == "__main__":
    main()
