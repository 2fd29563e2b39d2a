"""`kit ui` (issue 44 item 3): the job list and job pages, served on loopback to the holder of the session's
token, checked in Debian's headless Chromium — a running 2-node job (its timeline, ranks, batch log; a screenshot
kept) and the page of a 64-node job's directory; a job's own text is shown, never run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from helpers import kit, require, scancel, submit, wait_for

from kit.jobdir import JobDir
from kit.jobdir.metrics import write_rank_metrics
from kit.ui import server

TRAIN = [sys.executable, "-m", "kit.train"]


@pytest.fixture
def serving(tmp_path):
    """A kit ui of ``tmp_path/jobs`` in this process: (its address with the token, its bare address)."""
    running = server.start(server.Ui((str(tmp_path / "jobs"),)))
    thread = threading.Thread(target=running.serve_forever, daemon=True)
    thread.start()
    yield server.address(running), f"http://127.0.0.1:{running.server_address[1]}"
    running.shutdown()
    running.server_close()


def chromium(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    require("chromium")
    home = Path(os.environ.get("TMPDIR", "/tmp"))
    return subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
         f"--user-data-dir={home / f'kit-chromium-{os.getpid()}'}", *args],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def dom(url: str) -> str:
    proc = chromium("--dump-dom", url)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def status_of(url: str, cookie: str | None = None) -> int:
    request = urllib.request.Request(url, headers={"Cookie": cookie} if cookie else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_without_the_token_nothing_is_shown(serving):
    with_token, bare = serving
    assert status_of(bare + "/") == 403 and status_of(bare + "/api/jobs") == 403
    assert status_of(bare + "/", cookie="kit_ui=guess") == 403
    assert status_of(bare + "/?token=guess") == 403
    token = with_token.split("token=")[1]
    assert status_of(bare + "/api/jobs", cookie=f"kit_ui={token}") == 200
    assert status_of(bare + "/job/12345", cookie=f"kit_ui={token}") == 404


def test_a_running_two_node_job_in_the_browser(cluster, tmp_path, serving):
    with_token, bare = serving
    job = submit(tmp_path, "--nodes", "2", command=[*TRAIN, "--max-steps", "3000", "--step-delay", "0.05"])
    job_id, job_dir = job["job_id"], Path(job["job_dir"])
    try:
        wait_for(lambda: len(list(job_dir.glob("metrics/*/rank-*.json"))) == 2, 120, what="both ranks' metrics")
        listing = dom(with_token)  # the token is exchanged for a cookie, then the list
        assert f'href="/job/{job_id}"' in listing and "RUNNING" in listing, listing
        page = dom(with_token.replace("/?", f"/job/{job_id}?"))
        for text in ("RUNNING", "Timeline", "first step", "every task running", "Ranks", "node1", "node2", "Batch log"):
            assert text in page, (text, page)
        assert '<meta http-equiv="refresh"' in page  # it reloads while the job runs
        shot = tmp_path / "job-page.png"
        proc = chromium(f"--screenshot={shot}", "--window-size=1280,1000", with_token.replace("/?", f"/job/{job_id}?"))
        assert proc.returncode == 0 and shot.stat().st_size > 10_000, proc.stderr[-2000:]
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        keep = os.environ.get("KIT_TEST_ARTIFACTS")
        if keep:
            shutil.copy(shot, Path(keep) / "kit-ui-job-page.png")
        api = json.loads(
            urllib.request.urlopen(
                urllib.request.Request(
                    f"{bare}/api/job/{job_id}", headers={"Cookie": f"kit_ui={with_token.split('token=')[1]}"}
                ),
                timeout=10,
            ).read()
        )
        assert api["row"]["id"] == job_id and sorted(api["ranks"]) == ["0", "1"]
    finally:
        scancel(cluster, job_id)


def sixty_four_nodes(root: Path, name: str = "wide") -> tuple[str, Path]:
    """A 64-node job's directory as its run leaves it: submitted, started, every rank's metrics and timeline, a batch
    log; its name carries markup, which the page must show as text."""
    d = root / "jobs" / "kit-64"
    progress = d / "progress" / "r0"
    progress.mkdir(parents=True)
    now = time.time()
    (d / JobDir.SPEC).write_text(json.dumps({"job_name": name, "nodes": 64}))
    (d / JobDir.JOB_ID).write_text("990064\n")
    (d / JobDir.SLURM).write_text(json.dumps({"conf": str(root / "no-such-slurm.conf")}))
    (progress / JobDir.STEP_START).write_text(f"{now - 60}\n")
    (progress / JobDir.TIMELINE.format(rank=0)).write_text(f"first {now - 50} 1\n")
    for rank in range(64):
        node = f"node{rank + 1:02d}"
        (progress / JobDir.TASK.format(rank=rank)).write_text(f"{node} {1000 + rank} {now - 55}\n")
        values = {
            "step": 420.0,
            "loss": 2.5 - rank / 100,
            "samples_per_second": 95.0,
            "last_step_timestamp_seconds": now,
        }
        write_rank_metrics(d / JobDir.METRICS / node, rank, values)
    (d / JobDir.LOGS).mkdir()
    (d / JobDir.LOGS / JobDir.BATCH_LOG.format(job_id="990064")).write_text("[kit] run 0: 64 node(s)\n</pre><b>x</b>\n")
    return "990064", d


def test_a_sixty_four_node_job_page_shows_every_rank_and_no_markup_of_the_job(tmp_path, serving):
    with_token, _ = serving
    job_id, _ = sixty_four_nodes(tmp_path, name="<img src=x onerror=alert(1)>")
    page = dom(with_token.replace("/?", f"/job/{job_id}?"))
    assert page.count('<tr><td class="n">') >= 64 and "node64" in page and "node01" in page, page[:3000]
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "<b>x</b>" not in page and "&lt;/pre&gt;&lt;b&gt;x&lt;/b&gt;" in page
    assert kit("ui", "--port", "70000").returncode == 2
