"""`kit ui`: the job list and job pages served on loopback by kit itself (stdlib's HTTP server, read-only).

A login node is shared: anyone there reaches 127.0.0.1. So every request carries the session's token — in the
address `kit ui` prints (``?token=…``, exchanged for a cookie at once) or in that cookie — else it gets 403 and
nothing of the jobs, as Jupyter does. Cookies do not isolate by port (RFC 6265 §8.5): each server's cookie has a name
of its own (its port and a random part), so a second `kit ui` neither replaces nor is sent for the first's name. The
pages read what `kit ps` and the job directory hold; nothing is written.
"""

from __future__ import annotations

import hmac
import json
import re
import secrets
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from kit import jobdir
from kit.errors import KitError
from kit.job import listing
from kit.jobdir import JobDir
from kit.jobdir.events import events
from kit.jobdir.metrics import newest_rank_metrics
from kit.ui import page
from kit.ui.states import States

COOKIE = "kit_ui"  # each server's cookie: COOKIE_PORT_RANDOM (_Server.cookie)
PICTURE_LIMIT = 32 << 20  # bytes of a report's picture served
HTML, JSON = "text/html; charset=utf-8", "application/json"
NOT_FOUND = (404, "text/plain; charset=utf-8", b"no such page\n")
# Nothing from anywhere else, no script at all: the pages are text and the report's picture.
HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; form-action 'self'",
}


@dataclass
class Ui:
    """What the pages show: the jobs under ``output_dirs`` (kit ps's), for whoever holds ``token``."""

    output_dirs: tuple[str, ...]
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    _dirs: dict[str, Path] = field(default_factory=dict)  # job id -> its directory, as the list last saw it
    _lock: threading.Lock = field(default_factory=threading.Lock)
    states: States = field(default_factory=States)  # Slurm's, asked in the background (kit.ui.states)

    def close(self) -> None:
        self.states.close()

    def rows(self, query: dict[str, str]) -> list[listing.JobRow]:
        """`kit ps`'s rows, its filters from the query (state, name, since in seconds, user, all)."""
        since = (
            float(query["since"]) if re.fullmatch(r"\d{1,9}(\.\d{0,6})?", query.get("since", ""), re.ASCII) else None
        )
        wanted = listing.Filter.checked(
            query.get("state") or None, query.get("name") or None, since, query.get("user") or None
        )
        dirs = [Path(d) for d in self.output_dirs]
        rows = listing.list_jobs(dirs, everything=bool(query.get("all")) or since is not None, ask=self.states)
        with self._lock:
            self._dirs.update({r.id: Path(r.job_dir) for r in rows})
        now = time.time()
        return [r for r in rows if wanted(r, now)]

    def job(self, job_id: str) -> listing.JobRow | None:
        """The job's row (`kit ps`'s), read from its directory alone once the list has seen it."""
        with self._lock:
            known = self._dirs.get(job_id)
        if known is None:
            self.rows({"all": "1"})
            with self._lock:
                known = self._dirs.get(job_id)
        rows = listing.list_jobs([], everything=True, only=[known], ask=self.states) if known else []
        found = [r for r in rows if r.id == job_id]
        return found[0] if found else None

    def answer(self, path: str, query: dict[str, str]) -> tuple[int, str, bytes]:
        """(HTTP status, content type, body) for a GET of ``path``: ``/``, ``/job/ID``, ``/job/ID/report.png``,
        ``/api/jobs``, ``/api/job/ID``."""
        now = time.time()
        if path == "/":
            return 200, HTML, page.job_list(self.rows(query), query, now).encode()
        if path == "/api/jobs":
            return 200, JSON, json.dumps([r.as_json() for r in self.rows(query)]).encode()
        parts = [urllib.parse.unquote(p) for p in path.strip("/").split("/")]
        routes = {("job", 2): "page", ("job", 3): "picture", ("api", 3): "json"}
        route = routes.get((parts[0], len(parts)))
        job_id = (
            parts[2] if route == "json" and parts[1] == "job" else parts[1] if route in ("page", "picture") else None
        )
        row = self.job(job_id) if job_id and (route != "picture" or parts[2] == JobDir.REPORT) else None
        if row is None:
            return NOT_FOUND
        job_dir = row.unit_dir
        if route == "page":
            return 200, HTML, page.job_page(row, job_dir, now).encode()
        if route == "picture":
            try:
                return 200, "image/png", jobdir.read_own(job_dir / JobDir.REPORT, PICTURE_LIMIT)
            except (OSError, KitError):
                return NOT_FOUND
        ranks = {rank: {"node": node, **values} for rank, (node, values) in newest_rank_metrics(job_dir).items()}
        body = {"row": row.as_json(), "events": [ev.as_json() for ev in events(job_dir)], "ranks": ranks}
        return 200, JSON, json.dumps(body).encode()


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        ui = self.server.ui
        token = query.pop("token", None)
        if token is not None and hmac.compare_digest(token.encode(), ui.token.encode()):
            rest = urllib.parse.urlencode(query)
            self._send(303, "text/plain", b"", Location=url.path + (f"?{rest}" if rest else ""),
                       **{"Set-Cookie": f"{self.server.cookie}={ui.token}; Path=/; HttpOnly; SameSite=Strict"})  # fmt: skip
            return
        cookies = dict(c.strip().partition("=")[::2] for c in self.headers.get("Cookie", "").split(";") if "=" in c)
        if not hmac.compare_digest(cookies.get(self.server.cookie, "").encode(), ui.token.encode()):
            self._send(403, "text/plain", b"kit ui: open the address kit ui printed (it holds this session's token)\n")
            return
        try:
            status, kind, body = ui.answer(url.path, query)
        except KitError as e:
            status, kind, body = 400, "text/plain; charset=utf-8", (e.format() + "\n").encode()
        self._send(status, kind, body)

    def _send(self, status: int, kind: str, body: bytes, **extra: str) -> None:
        self.send_response(status)
        for k, v in {**HEADERS, "Content-Type": kind, "Content-Length": str(len(body)), **extra}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, ui: Ui, port: int):
        self.ui = ui
        super().__init__(("127.0.0.1", port), _Handler)
        self.cookie = f"{COOKIE}_{self.server_address[1]}_{secrets.token_hex(4)}"

    def server_close(self) -> None:
        super().server_close()
        self.ui.close()  # its background asks of Slurm end with it


def start(ui: Ui, port: int = 0) -> _Server:
    """The server, bound to 127.0.0.1:``port`` (0: any free one); ``serve_forever()`` serves it."""
    try:
        return _Server(ui, port)
    except OSError as e:
        raise KitError(
            f"cannot listen on 127.0.0.1:{port}: {e.strerror}", field="--port", hint="choose another --port"
        ) from None


def cookie(server: _Server) -> str:
    """The ``Cookie`` header this server's pages take: its own cookie's name, the session's token."""
    return f"{server.cookie}={server.ui.token}"


def address(server: _Server) -> str:
    """What to open: the address with the session's token."""
    return f"http://127.0.0.1:{server.server_address[1]}/?token={server.ui.token}"
