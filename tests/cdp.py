"""Debian's headless Chromium driven through its DevTools protocol (CDP) over ``--remote-debugging-pipe``: JSON
messages ended by a NUL byte, Chromium reading file descriptor 3 and writing 4. No driver to install, no port: the
browser's commands go over a pipe only this process holds."""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time


def _above(fd: int, low: int) -> int:
    import fcntl

    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, low)
    os.close(fd)
    return high


class Browser:
    """One headless Chromium; :meth:`open` a page, then :meth:`text`, :meth:`evaluate`, :meth:`screenshot`."""

    def __init__(self, timeout: float = 60):
        self.profile = tempfile.mkdtemp(prefix="kit-chromium-")
        to_chromium, self._w = os.pipe()
        self._r, from_chromium = os.pipe()
        # Above 4, so that putting one at 3 or 4 never closes the other.
        to_chromium, from_chromium = (_above(fd, 10) for fd in (to_chromium, from_chromium))
        argv = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
                f"--user-data-dir={self.profile}", "--remote-debugging-pipe", "about:blank"]  # fmt: skip
        # bash puts the pipe's ends at 3 and 4, where Chromium looks for them.
        self.proc = subprocess.Popen(
            ["bash", "-c", f'exec "$@" 3<&{to_chromium} 4>&{from_chromium} {to_chromium}<&- {from_chromium}>&-',
             "bash", *argv],
            pass_fds=(to_chromium, from_chromium), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        os.close(to_chromium)
        os.close(from_chromium)
        self.timeout, self._id, self._buffer, self.session = timeout, 0, b"", None

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        """One command; its result (RuntimeError: the browser's error, or no answer within the timeout)."""
        self._id += 1
        message = {"id": self._id, "method": method, "params": params or {}}
        if session or self.session:
            message["sessionId"] = session or self.session
        os.write(self._w, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            while b"\0" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self._r], [], [], left)[0]:
                    raise RuntimeError(f"chromium did not answer {method} in {self.timeout} s")
                chunk = os.read(self._r, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"chromium closed its pipe (exit {self.proc.poll()}) during {method}")
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            answer = json.loads(raw)
            if answer.get("id") == self._id:  # events in between are not waited for
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer["result"]

    def open(self, url: str) -> None:
        """A new tab at ``url``, this browser's commands going to it; back once its document is loaded."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.go(url)

    def go(self, url: str) -> None:
        self.send("Page.navigate", {"url": url})
        self.loaded()

    def loaded(self) -> None:
        deadline = time.monotonic() + self.timeout
        while self.evaluate("document.readyState") != "complete" or self.evaluate("location.href") == "about:blank":
            if time.monotonic() > deadline:
                raise RuntimeError("the page did not load")
            time.sleep(0.05)

    def evaluate(self, expression: str):
        """``expression``'s value in the page."""
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def text(self) -> str:
        """What the page shows (its body's rendered text)."""
        return self.evaluate("document.body.innerText")

    def html(self) -> str:
        return self.evaluate("document.documentElement.outerHTML")

    def screenshot(self, width: int = 1280, height: int = 1000) -> bytes:
        self.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                          "mobile": False})  # fmt: skip
        return base64.b64decode(self.send("Page.captureScreenshot", {"format": "png"})["data"])

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (RuntimeError, OSError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._w)
        os.close(self._r)
        shutil.rmtree(self.profile, ignore_errors=True)
