"""`kit ui`: the job list and job pages, served on loopback to the holder of the session's
token, checked in Debian's headless Chromium (driven through its DevTools protocol: tests/cdp.py) — a running 2-node job (its timeline, ranks, batch log; a screenshot
kept) and the page of a 64-node job's directory; a job's own text is shown, never run."""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from cdp import Browser
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
    yield server.address(running), f"http://127.0.0.1:{running.server_address[1]}", server.cookie(running)
    running.shutdown()
    running.server_close()


@pytest.fixture
def browser():
    """Debian's headless Chromium, driven through its DevTools protocol (tests/cdp.py)."""
    require("chromium")
    b = Browser()
    yield b
    b.close()


def status_of(url: str, cookie: str | None = None) -> int:
    request = urllib.request.Request(url, headers={"Cookie": cookie} if cookie else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_without_the_token_nothing_is_shown(serving):
    with_token, bare, cookie = serving
    name, token = cookie.split("=")
    assert token == with_token.split("token=")[1]
    assert status_of(bare + "/") == 403 and status_of(bare + "/api/jobs") == 403
    assert status_of(bare + "/", cookie=f"{name}=guess") == 403
    assert status_of(bare + "/?token=guess") == 403
    assert status_of(bare + "/api/jobs", cookie=f"kit_ui={token}") == 403  # the name of no server
    assert status_of(bare + "/api/jobs", cookie=cookie) == 200
    assert status_of(bare + "/job/12345", cookie=cookie) == 404


def test_a_since_that_is_no_number_is_ignored_not_a_dropped_answer(serving):
    """`?since=²` ("²".isdigit() is true, float("²") fails): the request got no answer at all. Ignored, as any text."""
    _, bare, cookie = serving
    for since in ("%C2%B2", "1e999", "-5", "nan"):
        assert status_of(f"{bare}/api/jobs?since={since}", cookie=cookie) == 200, since


def test_each_kit_ui_has_a_cookie_of_its_own(tmp_path):
    """Cookies do not isolate by port (RFC 6265 §8.5): with one name for every `kit ui`, a second one's cookie
    replaced the first's in the browser (logged out), and each was sent the other's token. Each server names its
    cookie by its port and a random part, and takes only its own."""
    servers = [server.start(server.Ui((str(tmp_path / "jobs"),))) for _ in range(2)]
    try:
        for s in servers:
            threading.Thread(target=s.serve_forever, daemon=True).start()
        names = [server.cookie(s).split("=")[0] for s in servers]
        assert names[0] != names[1] and all(f"_{s.server_address[1]}_" in n for s, n in zip(servers, names))
        for s, other in (servers, servers[::-1]):
            bare = f"http://127.0.0.1:{s.server_address[1]}"
            assert status_of(bare + "/api/jobs", cookie=server.cookie(other)) == 403
            both = f"{server.cookie(other)}; {server.cookie(s)}"  # what a browser holding both sends to either
            assert status_of(bare + "/api/jobs", cookie=both) == 200
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()


RANK_STEP = (  # rank 0's step in the page's rank table (null while the page reloads)
    "(() => { const r = [...document.querySelectorAll('tr')].find(r => r.cells.length === 6 && "
    "r.cells[0].innerText === '0'); return r ? r.cells[2].innerText : null; })()"
)


def test_a_running_two_node_job_in_the_browser(cluster, tmp_path, serving, browser):
    """The job list and a running 2-node job's page in Chromium: what they show, the page reloading itself while the
    job trains (rank 0's step goes up without a click), a screenshot kept."""
    with_token, bare, cookie = serving
    job = submit(tmp_path, "--nodes", "2", command=[*TRAIN, "--max-steps", "3000", "--step-delay", "0.05"])
    job_id, job_dir = job["job_id"], Path(job["job_dir"])
    try:
        wait_for(lambda: len(list(job_dir.glob("metrics/*/rank-*.json"))) == 2, 120, what="both ranks' metrics")
        browser.open(with_token)  # the token is exchanged for a cookie, then the list
        assert browser.evaluate(f"document.querySelectorAll('a[href=\"/job/{job_id}\"]').length") == 1
        assert "RUNNING" in browser.text()
        browser.go(f"{bare}/job/{job_id}")  # the cookie alone from here on
        page = browser.text()
        for text in ("RUNNING", "Timeline", "first step", "every task running", "Ranks", "node1", "node2", "Batch log"):
            assert text in page, (text, page)
        assert browser.evaluate("document.querySelector('meta[http-equiv=refresh]').content") == "5"

        def step() -> int | None:
            try:
                shown = browser.evaluate(RANK_STEP)
            except RuntimeError:  # the page reloading under the question
                return None
            return int(shown) if shown and shown.isdigit() else None

        before = wait_for(step, 30, what="rank 0's step on the page")
        wait_for(lambda: (step() or 0) > before, 30, what="the page to show a later step by itself")
        kept_screenshot(browser, tmp_path / "kit-ui-job-page.png")
        api = json.loads(
            urllib.request.urlopen(
                urllib.request.Request(f"{bare}/api/job/{job_id}", headers={"Cookie": cookie}),
                timeout=10,
            ).read()
        )
        assert api["row"]["id"] == job_id and sorted(api["ranks"]) == ["0", "1"]
    finally:
        scancel(cluster, job_id)


def kept_screenshot(browser, shot: Path) -> None:
    """The page as Chromium draws it, a PNG at ``shot``, kept in $KIT_TEST_ARTIFACTS where that is set."""
    shot.write_bytes(browser.screenshot(1280, 1000))
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    keep = os.environ.get("KIT_TEST_ARTIFACTS")
    if keep:
        shutil.copy(shot, Path(keep) / shot.name)


def sixty_four_nodes(root: Path, name: str = "wide") -> tuple[str, Path]:
    """A 64-node job's directory as its run leaves it: submitted, started, every rank's metrics and timeline, a batch
    log; its name carries markup, which the page must show as text."""
    d = root / "jobs" / "kit-64"
    progress = d / "progress" / "r0"
    progress.mkdir(parents=True)
    now = time.time()
    (d / JobDir.SPEC).write_text(json.dumps({"job_name": name, "nodes": 64}))
    (d / JobDir.JOB_ID).write_text("990064\n")
    os.utime(d / JobDir.JOB_ID, (now - 70, now - 70))  # submitted before it started
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


def test_a_sixty_four_node_job_page_shows_every_rank_and_no_markup_of_the_job(tmp_path, serving, browser):
    with_token, _, _ = serving
    job_id, _ = sixty_four_nodes(tmp_path, name="<img src=x onerror=alert(1)>")
    browser.open(with_token.replace("/?", f"/job/{job_id}?"))
    ranks = browser.evaluate(
        "[...document.querySelectorAll('tr')].filter(r => r.cells.length === 6 && r.cells[0].tagName === 'TD').length"
    )
    assert ranks == 64 and "node64" in browser.text() and "node01" in browser.text()
    kept_screenshot(browser, tmp_path / "kit-ui-64-node-page.png")
    # The job's own markup is text on the page, never an element of it.
    assert browser.evaluate("document.querySelectorAll('img, b').length") == 0
    assert "<img src=x onerror=alert(1)>" in browser.text() and "</pre><b>x</b>" in browser.text()
    assert kit("ui", "--port", "70000").returncode == 2


def test_slurm_is_asked_in_the_background_and_a_page_never_waits_for_it(monkeypatch):
    """kit.ui.states: the first look at a job waits for Slurm; later pages take what Slurm said last, asked again
    every EVERY seconds in the background for the jobs a page showed within KEEP; answers grown old (the background
    failing) are asked for again, the page then waiting and hearing Slurm's problem."""
    from kit.errors import KitError
    from kit.ui import states

    monkeypatch.setattr(states, "EVERY", 0.1)
    monkeypatch.setattr(states, "FRESH", 0.5)
    monkeypatch.setattr(states, "KEEP", 1.0)
    asked, down = [], threading.Event()

    def ask(target, names):
        if down.is_set():
            raise KitError("slurmctld does not answer")
        asked.append(list(names))
        return {n: f"state {len(asked)}" for n in names}

    s = states.States(ask)
    try:
        assert s("slurm A", ["7"]) == {"7": "state 1"} and len(asked) == 1  # the first look waits
        assert s("slurm A", ["7"]) == {"7": "state 1"} and len(asked) == 1  # the next takes what was heard
        wait_for(lambda: len(asked) >= 3, 5, what="asks in the background")
        assert s("slurm A", ["7"])["7"] != "state 1" and asked[-1] == ["7"]
        time.sleep(1.6)  # no page looked for KEEP seconds: no more asks
        quiet = len(asked)
        time.sleep(0.5)
        assert len(asked) == quiet
        s("slurm A", ["7"])  # looked at again: asked again
        down.set()
        time.sleep(0.7)  # the background's asks fail; what was heard grows old
        with pytest.raises(KitError, match="does not answer"):
            s("slurm A", ["7"])
        thread = s._thread
    finally:
        s.close()
    assert not thread.is_alive() and s._thread is None


def test_the_job_page_says_the_preflight_goodput_and_stragglers_as_kit_report_does(tmp_path):
    """The job page's rows as the other surfaces say them: the preflight's verdict with the nodes it checked (it read
    `ok:` with nothing after), goodput (it had none), each straggler with its rank and node first (it showed the
    evidence alone)."""
    from kit.job.listing import JobRow
    from kit.ui.page import job_page

    straggler = {"rank": 3, "node": "node2", "factor": 2.0, "evidence": "they wait 400 ms", "since": 1.0, "at": 2.0}
    row = JobRow(
        *("42", "unit", "RUNNING", "slurm", "", "node1,node2", 0, 10, 100, 0.5, 20.0, 0.0, str(tmp_path), False),
        stragglers=[straggler],
        preflight={"verdict": "ok", "nodes": [], "why": "", "checked": ["node1", "node2"]},
        goodput=0.875,
    )
    page = job_page(row, tmp_path, 10.0)
    assert "<th>preflight</th><td>ok (node1, node2 checked)</td>" in page, page
    assert "<th>goodput</th><td>87.5% of its time trained</td>" in page, page
    assert "straggler: rank 3 on node2, 2.00x the other ranks&#x27; step (they wait 400 ms)" in page, page
