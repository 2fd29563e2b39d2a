"""--notify: a job's events sent to a JSON webhook, Slack and mail, each exactly once across a
restart in the allocation, an admin's requeue and a slurmctld restart, within seconds; a dead or silent receiver
costs the job nothing and `kit report` says what was not delivered; the URL's secret is in no process's argv, no log
and no file another user can read. Receivers on loopback: a counting HTTP server and a small SMTP server."""

from __future__ import annotations

import json
import os
import socket
import socketserver
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import Receiver, kit, read_logs, release_requeued, scontrol, wait_for

from kit.core import notify as targets
from kit.errors import KitError
from kit.jobdir import JobDir
from kit.notify import deliver, ledger
from kit.notify import send as sender

SECRET = "T0KEN-s3cret-9f2c"


class Smtp(socketserver.ThreadingTCPServer):
    """Enough SMTP to take a mail: each DATA kept in ``mails``."""

    allow_reuse_address = True
    daemon_threads = True

    def __init__(self):
        self.mails: list[str] = []
        outer = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                self.wfile.write(b"220 test ESMTP\r\n")
                while line := self.rfile.readline():
                    verb = line[:4].upper()
                    if verb == b"DATA":
                        self.wfile.write(b"354 go on\r\n")
                        data = []
                        while (row := self.rfile.readline()) not in (b".\r\n", b""):
                            data.append(row.decode())
                        outer.mails.append("".join(data))
                        self.wfile.write(b"250 kept\r\n")
                    elif verb == b"QUIT":
                        self.wfile.write(b"221 bye\r\n")
                        return
                    else:
                        self.wfile.write(b"250 ok\r\n")

        super().__init__(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


# ---------------------------------------------------------------- targets


def test_targets_parse_and_never_show_their_secret():
    hook = targets.parse(f"https://hooks.example.org/services/{SECRET}?x=1")
    assert (hook.kind, hook.shown()) == ("webhook", "https://hooks.example.org/…")
    assert targets.parse(f"http://[::1]:8443/{SECRET}").shown() == "http://[::1]:8443/…"  # the port: which hook
    slack = targets.parse(f"slack:https://hooks.slack.com/services/{SECRET}")
    assert (slack.kind, slack.shown()) == ("slack", "slack:https://hooks.slack.com/…")
    mail = targets.parse("mailto:ops@example.org?smtp=mail.example.org:2525")
    assert (mail.kind, mail.address, mail.smtp) == ("mail", "ops@example.org", "mail.example.org:2525")
    assert targets.parse("mailto:me@host").smtp == ""
    for bad in (f"ftp://x/{SECRET}", f"slack:ftp://x/{SECRET}", "mailto:nobody", "mailto:a@b?cc=x", "webhook", ""):
        with pytest.raises(KitError) as e:
            targets.parse(bad)
        assert SECRET not in e.value.format() and "https://HOST/PATH" in (e.value.hint or ""), e.value.format()


def test_a_target_that_fails_only_when_sent_is_refused_at_parse_time(tmp_path):
    """A port like abc or 99999, a broken IPv6 address, an SMTP port out of range: each passed the parse and was a
    traceback (or a lost message) at the job's end. One line, exit 2, at submission; so is a job name with a line
    break where a mail is to carry it in its Subject (elsewhere any name reaches the job as it is)."""
    for bad in (
        f"http://hooks.example.org:abc/{SECRET}",
        f"https://hooks.example.org:99999/{SECRET}",
        f"http://[x/{SECRET}",
        "mailto:me@example.org?smtp=mail.example.org:99999",
    ):
        proc = kit("launch", "--dry-run", "--output-dir", str(tmp_path), "--notify", bad, "--", "true")
        assert proc.returncode == 2 and proc.stderr.startswith("kit: --notify: "), (bad, proc.stderr)
        assert len(proc.stderr.splitlines()) <= 2 and SECRET not in proc.stderr, proc.stderr
    mail = ("--notify", "mailto:me@example.org")
    proc = kit("launch", "--dry-run", "--output-dir", str(tmp_path), "--job-name", "a\nSubject: x", *mail, "--", "true")
    assert proc.returncode == 2 and proc.stderr.startswith("kit: --job-name: "), proc.stderr


def test_a_bad_target_is_one_message_and_exit_2_and_a_good_one_stays_private(tmp_path):
    proc = kit("launch", "--dry-run", "--output-dir", str(tmp_path), "--notify", f"ftp://x/{SECRET}", "--", "true")
    assert proc.returncode == 2 and proc.stderr.startswith("kit: --notify: "), proc.stderr
    assert SECRET not in proc.stderr + proc.stdout and "Traceback" not in proc.stderr
    url = f"https://hooks.example.org/{SECRET}"
    proc = kit(
        "launch", "--dry-run", "--json", "--output-dir", str(tmp_path), "--notify", url, "--", "true", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert SECRET not in proc.stdout + proc.stderr
    job_dir = Path(json.loads(proc.stdout)["job_dir"])
    assert json.loads((job_dir / JobDir.SPEC).read_text())["notify"] == [url]
    assert_private(job_dir)


def assert_private(job_dir: Path) -> None:
    """The secret only in files no one else can read, under directories no one else can enter."""
    holding = []
    for root, _dirs, names in os.walk(job_dir):
        for name in names:
            path = Path(root) / name
            if path.is_file() and not path.is_symlink() and SECRET.encode() in path.read_bytes():
                holding.append(path)
                assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
    assert holding, "the spec keeps the target"
    assert stat.S_IMODE(job_dir.stat().st_mode) & 0o077 == 0


# ---------------------------------------------------------------- delivery, from a job directory


def job_dir_with(tmp_path: Path, *notify: str) -> Path:
    d = tmp_path / "job"
    (d / "progress" / "r0").mkdir(parents=True, mode=0o700)
    (d / JobDir.SPEC).write_text(json.dumps({"notify": list(notify), "job_name": "unit"}))
    (d / JobDir.JOB_ID).write_text("42\n")
    (d / "progress" / "r0" / JobDir.STEP_START).write_text(f"{time.time()}\n")
    return d


def exited(d: Path, code: int, run: int = 0) -> None:
    (d / "progress" / f"r{run}" / JobDir.EXITED).write_text(json.dumps({"code": code, "run": run, "stopped": 0}))


def test_each_event_goes_once_to_each_target_and_a_second_sender_sends_nothing(tmp_path, receiver):
    smtp = Smtp()
    try:
        d = job_dir_with(
            tmp_path,
            receiver.url + f"/hook/{SECRET}",
            f"slack:{receiver.url}/slack",
            f"mailto:me@x.org?smtp={smtp.address}",
        )
        assert deliver.deliver(d) == 3  # started, to each
        exited(d, 3)
        assert deliver.last_word(d) == 3 and deliver.last_word(d) == 0 and deliver.deliver(d) == 0
    finally:
        smtp.shutdown()
        smtp.server_close()
    hooks = receiver.bodies(f"/hook/{SECRET}")
    assert [(b["key"], b["event"]) for b in hooks] == [("started:0:0", "started"), ("ended", "ended")]
    end = hooks[1]
    # With the job's duration (kit.jobdir.tally: no samples reported here, no rate).
    assert (
        end["text"].startswith("ended: the command failed with exit code 3 (exit code 3); ") and end["exit_code"] == 3
    )
    assert end["text"].endswith(" s from submission to its end") and end["samples_per_second"] is None
    assert end["job_id"] == "42" and end["job_name"] == "unit"
    assert [b["text"] for b in receiver.bodies("/slack")] == [
        "kit job 42 (unit): started",
        f"kit job 42 (unit): {end['text']}",
    ]
    assert len(smtp.mails) == 2 and "Subject: kit job 42 (unit): started" in smtp.mails[0]
    # Slurm's end seen later by a kit command is the same "ended": not sent again.
    (d / JobDir.OUTCOME).write_text(json.dumps({"state": "FAILED", "time": time.time()}))
    deliver.catch_up(d)
    assert len(receiver.got) == 4 and all(r["ok"] for r in ledger.read(d))


def test_a_dead_or_silent_receiver_is_given_up_on_in_bounded_time_and_recorded(tmp_path):
    silent = Receiver(delay=30)
    failing = Receiver(status=503)
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    d_port = dead.getsockname()[1]
    try:
        d = job_dir_with(
            tmp_path, f"http://127.0.0.1:{dead.getsockname()[1]}/{SECRET}", silent.url + "/s", failing.url + "/f"
        )
        began = time.monotonic()
        deliver.deliver(d)  # "started"
        took = time.monotonic() - began
    finally:
        dead.close()
        failing.close()
        silent.server.shutdown()
    # refused: 3 tries 1 s apart; silent: one try of 3 s (it may have arrived: never sent twice); 503: 3 tries.
    assert took < 4 * deliver.PAUSE + deliver.TIMEOUT + 3, took
    assert len(silent.got) == 1 and len(failing.got) == 3
    given_up = ledger.undelivered(d)
    assert len(given_up) == 3 and SECRET not in json.dumps(given_up)
    ports = (d_port, silent.url.rsplit(":", 1)[1], failing.url.rsplit(":", 1)[1])
    assert {r["shown"] for r in given_up} == {f"http://127.0.0.1:{p}/…" for p in ports}  # which hook: its port
    assert any("it may have arrived" in r["error"] for r in given_up)
    assert any("HTTP 503" in r["error"] for r in given_up)
    assert deliver.deliver(d) == 0  # given up is done: never sent again


def test_the_last_word_keeps_its_deadline_and_leaves_the_rest_to_the_next_sender(tmp_path):
    silent = Receiver(delay=30)
    try:
        d = job_dir_with(tmp_path, silent.url + "/a", silent.url + "/b")
        exited(d, 0)
        began = time.monotonic()
        sent = deliver.last_word(d, seconds=3.5)
        took = time.monotonic() - began
    finally:
        silent.server.shutdown()
    # Each target's first try at once, side by side (3 s); the next event had too little time left.
    assert took < 4.5 and sent == 2, (took, sent)
    assert sorted((r["key"], r["target"]) for r in ledger.read(d)) == [("started:0:0", 0), ("started:0:0", 1)]


def test_silent_receivers_do_not_starve_the_others(tmp_path):
    """Seven targets, four of them silent, the batch script's last word (5 s): one after the other, the job's end
    reached the first few and the rest were neither sent nor recorded. Side by side, every answering target gets
    every event, and each silent one's sends are recorded as given up (each within its own deadline)."""
    silent, good = Receiver(delay=30), Receiver()
    try:
        urls = [silent.url + "/s0", good.url + "/g1", silent.url + "/s2", good.url + "/g3"]
        urls += [silent.url + "/s4", good.url + "/g5", silent.url + "/s6"]
        d = job_dir_with(tmp_path, *urls)
        exited(d, 0)
        deliver.last_word(d, seconds=5)
    finally:
        good.close()
        silent.server.shutdown()
    for path in ("/g1", "/g3", "/g5"):
        assert [b["key"] for b in good.bodies(path)] == ["started:0:0", "ended"], path
    told = {(r["key"], r["target"]): r["ok"] for r in ledger.read(d)}
    assert {i: told.get(("ended", i)) for i in range(7)} == {i: i % 2 == 1 for i in range(7)}, told  # none untold


def test_a_redirect_or_a_senders_surprise_is_a_failed_send_never_ok_nor_a_traceback(tmp_path, monkeypatch):
    """A webhook answering 302 to the POST: urllib followed it as a GET without the body, and the send was recorded
    ok though nothing was delivered. A 3xx is a failed send. And any exception a send raises is that send's
    failure in the ledger (the --wait end's traceback, exit 1, after a COMPLETED job)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    landed = []

    class Redirecting(BaseHTTPRequestHandler):
        def do_POST(self):
            self.send_response(302)
            self.send_header("Location", "/landing")
            self.end_headers()

        def do_GET(self):
            landed.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirecting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        d = job_dir_with(tmp_path, f"http://127.0.0.1:{server.server_address[1]}/{SECRET}")
        assert deliver.deliver(d) == 1
    finally:
        server.shutdown()
        server.server_close()
    [given_up] = ledger.undelivered(d)
    assert "HTTP 302 (a redirect: not followed" in given_up["error"] and landed == [], (given_up, landed)

    def surprise(target, message, timeout):
        raise RuntimeError("a library's surprise")

    monkeypatch.setattr(sender, "send", surprise)
    d2 = job_dir_with(tmp_path / "b", f"http://127.0.0.1:9/{SECRET}")
    exited(d2, 0)
    assert deliver.last_word(d2) == 2
    assert [r["error"] for r in ledger.undelivered(d2)] == ["RuntimeError: a library's surprise"] * 2


def test_a_job_without_targets_or_with_a_foreign_spec_sends_nothing(tmp_path, receiver):
    d = job_dir_with(tmp_path)
    assert deliver.deliver(d) == 0 and not (d / JobDir.NOTIFY).exists()
    d2 = job_dir_with(tmp_path / "b", receiver.url + "/x")
    os.chmod(d2 / JobDir.SPEC, 0o666)  # anyone could have written it: not trusted
    assert deliver.deliver(d2) == 0 and receiver.got == []


# ---------------------------------------------------------------- a real job


def test_a_job_restarted_requeued_and_through_a_controller_restart_tells_each_event_once(cluster, tmp_path, receiver):
    """Run 0 fails (exit 3) and restarts in its allocation (--on-failure restart); run 1 trains through a slurmctld
    killed and started again, then an admin requeues it; run 2 finishes. The webhook and Slack each get every event
    once, each within 5 s of its time; the secret is in no argv, log or readable file."""
    script = tmp_path / "run.sh"
    script.write_text(
        'if [ "$KIT_RESTART" = 0 ]; then sleep 1; exit 3; fi\n'
        f"exec {sys.executable} -m kit.train --max-steps 400 --step-delay 0.05 --checkpoint-every 20 --log-every 50\n"
    )
    hook, slack = f"{receiver.url}/hook/{SECRET}", f"slack:{receiver.url}/slack/{SECRET}"
    proc = kit(
        "launch", "--local", "--json", "--heartbeat", "0", "--output-dir", str(tmp_path / "jobs"),
        "--on-failure", "restart", "--max-restarts", "3", "--notify", hook, "--notify", slack,
        "--", "bash", str(script), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    job_id, job_dir = json.loads(proc.stdout)["job_id"], Path(json.loads(proc.stdout)["job_dir"])
    keys = lambda: [b["key"] for b in receiver.bodies(f"/hook/{SECRET}")]  # noqa: E731
    wait_for(lambda: "first-step:1:0" in keys(), 120, what="run 1's first step told")
    argv = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert SECRET not in argv
    ctld = cluster.state().pids["slurmctld"]
    os.kill(ctld, 9)
    time.sleep(3)
    up = kit("cluster", "up", env={"KIT_HOME": str(cluster.home)})
    assert up.returncode == 0 and "restarting slurmctld" in up.stderr, up.stderr
    scontrol(cluster, "requeue", job_id)
    release_requeued(cluster, job_id, job_dir, restarts=1)
    wait_for(lambda: "ended" in keys(), 180, what="the end told")
    time.sleep(2)  # anything sent twice would have come by now
    want = ["started:0:0", "restarted:0:0", "started:1:0", "first-step:1:0", "stopped:1:0"]
    want += ["started:2:0", "first-step:2:0", "ended"]
    assert keys() == want, keys()
    assert [b["text"].split(": ", 1)[1] for b in receiver.bodies(f"/slack/{SECRET}")] == [
        b["text"] for b in receiver.bodies(f"/hook/{SECRET}")
    ]
    end = receiver.bodies(f"/hook/{SECRET}")[-1]
    assert end["text"].startswith("ended: the work finished (exit code 0); ") and end["goodput_line"].startswith(
        "goodput"
    )
    # The job's throughput and duration, as every surface gives them (kit.jobdir.tally).
    assert end["text"].endswith(" s from submission to its end") and end["samples_per_second"] > 0, end
    assert f"{end['samples_per_second']:.1f} samples/s ({end['samples']:.0f} samples in" in end["text"], end
    hooked = [(b, at) for p, b, at in receiver.got if p == f"/hook/{SECRET}"]
    late = [(b["key"], round(at - b["time"], 1)) for b, at in hooked if at - b["time"] > 5]
    print("event -> webhook, s:", {b["key"]: round(at - b["time"], 2) for b, at in hooked})
    assert late == [], late
    assert SECRET not in read_logs(job_dir)
    assert_private(job_dir)
    events = kit("events", str(job_dir))
    assert events.returncode == 0 and "restarting in the allocation after run 0 (failed)" in events.stdout, (
        events.stdout
    )
    assert "the batch script ended with exit code 0" in events.stdout


def test_a_dead_receiver_never_fails_the_job_and_the_report_says_what_was_not_delivered(cluster, tmp_path):
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, never listening: refused
    try:
        target = f"http://127.0.0.1:{dead.getsockname()[1]}/{SECRET}"
        proc = kit(
            "launch", "--local", "--wait", "--heartbeat", "0", "--output-dir", str(tmp_path / "jobs"),
            "--notify", target, "--", "bash", "-c", "echo work done; sleep 8", cwd=tmp_path,
        )  # fmt: skip
    finally:
        dead.close()
    assert proc.returncode == 0 and "ended COMPLETED" in proc.stderr, proc.stderr
    job_dir = next((tmp_path / "jobs").iterdir())
    given_up = ledger.undelivered(job_dir)
    assert [r["key"] for r in given_up] == ["started:0:0", "ended"], given_up
    report = kit("report", str(job_dir), "-o", str(tmp_path / "r.png"), "--prometheus", "http://127.0.0.1:1")
    assert report.returncode == 0, report.stderr
    assert f"a notification was not delivered: ended to {target.rsplit('/', 1)[0]}/…" in report.stdout, report.stdout
    assert SECRET not in report.stdout + report.stderr + read_logs(job_dir)


def test_what_the_batch_script_could_not_send_is_sent_by_the_next_kit_command_once(tmp_path, receiver):
    """The batch script killed before its last word: the job's end reached no one until a `--wait` saw it. `kit ps`,
    `kit events` and `kit report` hand an ended job's untold events to a sender of their own (not waiting on the
    receiver), and each is sent once however many commands see the job."""
    d = job_dir_with(tmp_path / "jobs", receiver.url + f"/hook/{SECRET}")
    exited(d, 0)
    (d / JobDir.OUTCOME).write_text(json.dumps({"state": "COMPLETED", "time": time.time()}))
    for command in (("ps", "--all", "--output-dir", str(tmp_path / "jobs")), ("events", str(d)), ("ps", "--all")):
        proc = kit(*command, cwd=tmp_path)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    wait_for(lambda: len(receiver.bodies(f"/hook/{SECRET}")) >= 2, 30, what="the untold events")
    time.sleep(2)  # a second sender, had one been started, would have sent by now
    assert [b["key"] for b in receiver.bodies(f"/hook/{SECRET}")] == ["started:0:0", "ended"]
    assert not deliver.pending(d)


def _contents(d: Path) -> dict[str, bytes]:
    """Every file under ``d`` by its path, byte for byte (a directory or link by its name alone)."""
    return {str(p.relative_to(d)): p.read_bytes() if p.is_file() and not p.is_symlink() else b"" for p in d.rglob("*")}


def test_reading_a_job_changes_nothing_and_sends_nothing_and_its_end_is_kept_once(cluster, tmp_path, receiver):
    """Reading a job has no effects. A job with --notify ends (its batch script tells the end itself); reading it
    then — Job.state(), kit ps's rows (kit.jobs), its events and logs, kit ui's list, page and JSON — writes nothing
    into its directory and sends nothing (Job.state() and kit ps's rows used to write outcome.json). `kit ps` is
    where a command sees the end: it keeps Slurm's state, once (kit.job.settle). After that `kit ps`, `kit events`,
    `kit logs`, Job.state() and kit ui's pages leave the directory byte for byte as it was, and send nothing."""
    import kit as kitlib
    from kit import slurm
    from kit.ui import server

    out = tmp_path / "jobs"
    proc = kit(
        "launch", "--local", "--json", "--heartbeat", "0", "--output-dir", str(out),
        "--notify", f"{receiver.url}/hook/{SECRET}", "--", "bash", "-c", "echo done", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    job_id, job_dir = json.loads(proc.stdout)["job_id"], Path(json.loads(proc.stdout)["job_dir"])
    wait_for(lambda: slurm.job_status(cluster.target, job_id).state in slurm.TERMINAL_STATES, 120, what="the job's end")
    wait_for(lambda: "ended" in [b["key"] for b in receiver.bodies(f"/hook/{SECRET}")], 30, what="the end told")

    def read_it() -> None:
        job = kitlib.Job(job_dir)
        assert job.state() == "COMPLETED" and job.logs(rank=0) == "done\n" and job.events()
        assert [j.row.state for j in kitlib.jobs(output_dirs=[out]) if j.dir.resolve() == job_dir.resolve()] == [
            "COMPLETED"
        ]
        ui = server.Ui((str(out),))
        try:
            for path in ("/", f"/job/{job_id}", f"/api/job/{job_id}", "/api/jobs"):
                assert ui.answer(path, {})[0] == 200, path
        finally:
            ui.close()

    def commands() -> None:
        for command in (("ps", "--all", "--output-dir", str(out)), ("events", str(job_dir)), ("logs", str(job_dir))):
            ran = kit(*command, cwd=tmp_path)
            assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr

    heard, before = len(receiver.got), _contents(job_dir)
    read_it()
    assert _contents(job_dir) == before and not (job_dir / JobDir.OUTCOME).exists()
    commands()  # kit ps sees the end: Slurm's state kept
    assert json.loads((job_dir / JobDir.OUTCOME).read_text())["state"] == "COMPLETED"
    settled = _contents(job_dir)
    read_it()
    commands()
    time.sleep(2)  # a sender, had one been started, would have sent by now
    assert _contents(job_dir) == settled and len(receiver.got) == heard
