"""Where ``--notify`` sends a job's events: parsed and checked once, shown without their secret.

``https://HOST/PATH`` (or ``http://``): a JSON webhook (one POST per event); ``slack:https://…``: a Slack
incoming webhook (``{"text": …}``); ``mailto:ADDRESS`` (``?smtp=HOST[:PORT]`` for an SMTP host the user names; else
the node's ``sendmail``, else ``localhost:25``). A webhook's path and query are its secret: they live in the job's
own files (mode 0600) and are shown as ``https://HOST[:PORT]/…`` everywhere kit prints a target.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass

from kit.errors import KitError

WEBHOOK, SLACK, MAIL = "webhook", "slack", "mail"
HINT = "give https://HOST/PATH (a JSON webhook), slack:https://HOST/PATH or mailto:ADDRESS[?smtp=HOST[:PORT]]"
_ADDRESS = re.compile(r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?")
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]{1,5})?")


@dataclass(frozen=True)
class Recipient:
    kind: str  # WEBHOOK, SLACK or MAIL
    address: str  # the URL, or the mail address
    smtp: str = ""  # MAIL: HOST[:PORT] the user named ('' : sendmail, else localhost)

    def shown(self) -> str:
        """The target without its secret: ``https://hooks.example/…``, ``mailto:ops@example.org``."""
        if self.kind == MAIL:
            return f"mailto:{self.address}"
        url = urllib.parse.urlsplit(self.address)
        host = f"[{url.hostname}]" if ":" in (url.hostname or "") else url.hostname  # an IPv6 address, bracketed
        port = f":{url.port}" if url.port is not None else ""  # two hooks on one host differ by it
        return ("slack:" if self.kind == SLACK else "") + f"{url.scheme}://{host}{port}/…"


def _url(value: str, given: str) -> str:
    try:
        url = urllib.parse.urlsplit(value)
        url.port  # noqa: B018 - a port like abc or 99999 raises here, not at the job's end
    except ValueError as e:  # "http://[x/": Invalid IPv6 URL; a port out of range
        raise KitError(f"not a web address: {given!r} ({e})", hint=HINT) from None
    if url.scheme not in ("https", "http") or not url.hostname or not value.isprintable() or " " in value:
        raise KitError(f"not a web address: {given!r}", hint=HINT)
    return value


def parse(value: str) -> Recipient:
    """One ``--notify`` value as a :class:`Recipient`; a KitError (the caller names the field) when it is none."""
    if not isinstance(value, str) or not value:
        raise KitError(f"expected a notification target, got {value!r}", hint=HINT)
    shown = value.split("//")[0] + "//…" if "//" in value else value  # never a URL's path: its secret
    if value.startswith("slack:"):
        return Recipient(SLACK, _url(value[len("slack:") :], shown))
    if value.startswith("mailto:"):
        address, _, query = value[len("mailto:") :].partition("?")
        if not _ADDRESS.fullmatch(address):
            raise KitError(f"not a mail address: {address!r}", hint=HINT)
        smtp = urllib.parse.parse_qs(query).get("smtp", [""])[-1] if query else ""
        port = smtp.rpartition(":")[2] if ":" in smtp else "25"
        if query and (
            not smtp
            or not _HOST.fullmatch(smtp)
            or not 0 < int(port) < 65536
            or set(urllib.parse.parse_qs(query)) != {"smtp"}
        ):
            raise KitError(f"a mailto: target takes ?smtp=HOST[:PORT] only, got {query!r}", hint=HINT)
        return Recipient(MAIL, address, smtp)
    if value.startswith(("https://", "http://")):
        return Recipient(WEBHOOK, _url(value, shown))
    raise KitError(f"expected a notification target, got {shown!r}", hint=HINT)


def parse_all(values) -> tuple[Recipient, ...]:
    return tuple(parse(v) for v in values)
