"""One event to one target: a JSON webhook, a Slack message or a mail; an OSError when it did not arrive."""

from __future__ import annotations

import json
import shutil
import smtplib
import socket
import subprocess
import urllib.error
import urllib.request
from email.message import EmailMessage

from kit.core.notify import MAIL, SLACK, Recipient
from kit.version import __version__


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A 3xx is an answer, not a delivery: urllib would follow a POST's 301/302/303 as a GET without its body."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # urllib then raises the 3xx as an HTTPError


_OPENER = urllib.request.build_opener(_NoRedirect)


class Retryable(OSError):
    """It did not arrive, and trying again cannot make it arrive twice (refused, unreachable, HTTP 429 or 5xx)."""


def subject(message: dict) -> str:
    """``kit job 42 (train): first step`` — the one line every target shows."""
    name = f" ({message['job_name']})" if message.get("job_name") else ""
    return " ".join(f"kit job {message.get('job_id') or '?'}{name}: {message['text']}".splitlines())  # one line


def send(target: Recipient, message: dict, timeout: float) -> None:
    """Deliver ``message`` (:func:`kit.notify.deliver.message`'s JSON record) to ``target`` within ``timeout``
    seconds; any failure is an OSError saying why (never the target's secret)."""
    if target.kind == MAIL:
        _mail(target, message, timeout)
        return
    body = {"text": subject(message)} if target.kind == SLACK else message
    request = urllib.request.Request(
        target.address,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "User-Agent": f"kit/{__version__}"},
        method="POST",
    )
    try:
        with _OPENER.open(request, timeout=timeout) as reply:
            reply.read(1 << 16)
    except urllib.error.HTTPError as e:
        error = Retryable if e.code == 429 or e.code >= 500 else OSError
        redirect = " (a redirect: not followed, nothing was delivered)" if 300 <= e.code < 400 else ""
        raise error(f"{target.shown()} answered HTTP {e.code}{redirect}") from None
    except urllib.error.URLError as e:
        if isinstance(e.reason, (ConnectionRefusedError, socket.gaierror)):  # it never went out
            raise Retryable(f"{target.shown()}: {e.reason}") from None
        raise OSError(f"{target.shown()}: {e.reason} (it may have arrived)") from None
    except (TimeoutError, OSError, ValueError) as e:  # it went out and no answer came: it may have arrived
        raise OSError(f"{target.shown()}: no answer within {timeout:.0f} s ({e}); it may have arrived") from None


def _mail(target: Recipient, message: dict, timeout: float) -> None:
    mail = EmailMessage()
    mail["To"] = target.address
    mail["From"] = message.get("user") or "kit"
    mail["Subject"] = subject(message)
    mail.set_content(json.dumps(message, indent=1) + "\n")
    sendmail = None if target.smtp else shutil.which("sendmail", path="/usr/sbin:/usr/lib:/usr/bin:/bin")
    try:
        if sendmail:
            subprocess.run(
                [sendmail, "-t", "-oi"], input=mail.as_bytes(), check=True, timeout=timeout, capture_output=True
            )
            return
        host, _, port = (target.smtp or "localhost").partition(":")
        with smtplib.SMTP(host, int(port or 25), timeout=timeout) as smtp:
            smtp.send_message(mail)
    except subprocess.CalledProcessError as e:
        raise OSError(f"sendmail exited {e.returncode}: {e.stderr.decode(errors='replace').strip()[:200]}") from None
    except subprocess.TimeoutExpired:
        raise OSError(f"sendmail took more than {timeout:.0f} s") from None
    except (smtplib.SMTPException, OSError) as e:
        raise OSError(f"{target.shown()}: {e}") from None
