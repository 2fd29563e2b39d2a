"""The HTTP server Prometheus scrapes: every GET (or HEAD) answers the families' text, whatever the path (as
prometheus_client's ``start_http_server``, whose import — http.server, wsgiref, urllib with ssl — cost the
exporter's start more than its use; see :mod:`kit.monitor.families`).

One thread per connection (a slow client holds only its own), a deadline on each, one request per connection.
"""

from __future__ import annotations

import socket
import socketserver
import threading
from typing import Callable

from kit.monitor.families import CONTENT_TYPE

DEADLINE = 10.0  # seconds a client has to send its request and take the answer
LONGEST = 64 * 1024  # a request's head, at most


class _Handler(socketserver.StreamRequestHandler):
    timeout = DEADLINE

    def handle(self) -> None:
        try:
            request = self.rfile.readline(LONGEST).decode("latin-1").split()
            read = 0
            while (line := self.rfile.readline(LONGEST)) not in (b"\r\n", b"\n", b""):
                read += len(line)
                if read > LONGEST:
                    return
        except (OSError, ValueError):
            return
        method = request[0] if request else ""
        if method not in ("GET", "HEAD"):
            self._answer("405 Method Not Allowed", b"only GET and HEAD\n", "text/plain; charset=utf-8", True)
            return
        try:
            body = self.server.render()
        except Exception as e:  # a bug in rendering answers 500, never ends the server
            self._answer("500 Internal Server Error", f"{type(e).__name__}: {e}\n".encode(), "text/plain", True)
            return
        self._answer("200 OK", body, CONTENT_TYPE, method == "GET")

    def _answer(self, status: str, body: bytes, kind: str, with_body: bool) -> None:
        head = f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        try:
            self.wfile.write(head.encode("latin-1") + (body if with_body else b""))
        except OSError:
            pass


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple, family: int, render: Callable[[], bytes]):
        self.address_family = family
        self.render = render
        super().__init__(address, _Handler)


def serve(bind: str, port: int, render: Callable[[], bytes]) -> socketserver.BaseServer:
    """Serve ``render()``'s bytes on ``bind``:``port`` from a daemon thread; OSError when the port is taken. Stop
    with ``shutdown()`` then ``server_close()``."""
    family = socket.getaddrinfo(bind, port, type=socket.SOCK_STREAM)[0][0]
    server = _Server((bind, port), family, render)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.5}, name="kit-scrapes", daemon=True
    ).start()
    return server
