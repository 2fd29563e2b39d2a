"""The job's network links on this node: the round trip of each TCP connection its processes send on.

A slow link — a NIC that trained down, a flaky cable, a congested port — slows every rank of a synchronous job alike
(each waits for the slowest transfer of the ring), so the ranks' step times cannot name it; the kernel's own measure
of each connection can. Every poll asks the kernel (netlink ``sock_diag``, the interface ``ss`` uses: no binary
needed, none of an image's tools, no privilege) for the established TCP sockets with their ``tcp_info``, keeps those
the job's processes hold (``/proc/PID/fd``: only the user's own processes are readable, which are the job's), and
serves, per peer address, the smoothed round trip of the busiest connection that sent bulk data since the last poll,
as the median of its last polls (``kit_job_link_rtt_seconds``). A link whose queue fills (a shaped or degraded link)
shows round trips of tens to hundreds of milliseconds where a healthy one shows well under one (measured on the
local cluster, 2 cores busy: 3-38 ms through a node shaped to 40 Mbit/s, 0.1-2.8 ms elsewhere).
kit.monitor.judges.LinkJudge names the node on every slow link. TCP only: gloo, NCCL's socket transport, the
job's stores; NCCL over InfiniBand/RoCE verbs sends no TCP and is not seen here.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import statistics
import struct
import time

from kit.monitor.families import Sample, SourceResult, Spec

RTT = Spec(
    "kit_job_link_rtt_seconds",
    "gauge",
    "The round trip of the job's TCP connections from this node to a peer (peer; local: this node's address): "
    "the median over the last polls of its busiest connection's smoothed round trip (the kernel's tcp_info), "
    "those polls only where it was busy enough to say (kit.monitor.round_trips.BUSY, POLLS).",
)
BUSY = 128 * 1024  # bytes a second a connection sends for its round trip to be the link's
POLLS = 5  # a link's round trip served: the median over its busy polls among this many

_NETLINK_SOCK_DIAG, _SOCK_DIAG_BY_FAMILY = 4, 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_INET_DIAG_INFO = 2
_TCP_ESTABLISHED = 1
_HEADER = struct.Struct("=IHHII")  # nlmsghdr
_MESSAGE = struct.Struct("=BBBB HH16s16sI8s IIIII")  # inet_diag_msg
_RTT_AT, _BYTES_ACKED_AT = 68, 120  # tcp_info offsets (linux/tcp.h)


def _request(family: int, seq: int) -> bytes:
    body = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 1 << (_INET_DIAG_INFO - 1), 0, 1 << _TCP_ESTABLISHED)
    body += bytes(48)  # inet_diag_sockid: any
    return _HEADER.pack(_HEADER.size + len(body), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST | _NLM_F_DUMP, seq, 0) + body


def _address(family: int, raw: bytes) -> str:
    if family == socket.AF_INET:
        return str(ipaddress.IPv4Address(raw[:4]))
    ip = ipaddress.IPv6Address(raw)
    return str(ip.ipv4_mapped or ip)


def _info(attrs: bytes) -> bytes | None:
    """The INET_DIAG_INFO attribute's payload (struct tcp_info) among a message's attributes."""
    at = 0
    while at + 4 <= len(attrs):
        length, kind = struct.unpack_from("=HH", attrs, at)
        if length < 4:
            return None
        if kind == _INET_DIAG_INFO:
            return attrs[at + 4 : at + length]
        at += (length + 3) & ~3
    return None


def tcp_connections(families: tuple[int, ...] = (socket.AF_INET, socket.AF_INET6)) -> list[dict]:
    """Every established TCP connection in this network namespace: inode, local and peer address, the smoothed
    round trip (seconds), bytes the peer acknowledged. OSError where the kernel has no sock_diag (then no link is
    measured)."""
    found, refused = [], []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as s:
        s.settimeout(5.0)
        for seq, family in enumerate(families, 1):
            s.send(_request(family, seq))
            try:
                found += _dump(s, seq)
            except OSError as e:  # a kernel without IPv6 (ipv6.disable=1) refuses that family alone
                refused.append(e)
    if len(refused) == len(families):
        raise refused[0]
    return found


def _dump(s: socket.socket, seq: int) -> list[dict]:
    found = []
    while True:
        data = s.recv(1 << 16)
        at = 0
        while at + _HEADER.size <= len(data):
            length, kind, _, got_seq, _ = _HEADER.unpack_from(data, at)
            if length < _HEADER.size:
                return found
            if got_seq == seq and kind == _NLMSG_DONE:
                return found
            if kind == _NLMSG_ERROR and got_seq == seq:
                code = -struct.unpack_from("=i", data, at + _HEADER.size)[0]
                raise OSError(code, f"sock_diag refused the dump: {os.strerror(code)}")
            body = data[at + _HEADER.size : at + length]
            if got_seq == seq and kind == _SOCK_DIAG_BY_FAMILY and len(body) >= _MESSAGE.size:
                found.append(_connection(body))
            at += (length + 3) & ~3


def _connection(body: bytes) -> dict:
    family, _, _, _, _, _, src, dst, _, _, _, _, _, _, inode = _MESSAGE.unpack_from(body)
    info = _info(body[_MESSAGE.size :]) or b""
    known = len(info) >= _BYTES_ACKED_AT + 8
    return {
        "inode": inode,
        "local": _address(family, src),
        "peer": _address(family, dst),
        "rtt": struct.unpack_from("=I", info, _RTT_AT)[0] / 1e6 if known else None,
        "bytes_acked": struct.unpack_from("=Q", info, _BYTES_ACKED_AT)[0] if known else None,
    }


def socket_inodes(pids) -> set[int]:
    """The inodes of the sockets the processes ``pids`` hold open (those readable: the user's own)."""
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    return inodes


def busy_links(connections: list[dict], inodes: set[int], before: dict[int, int], seconds: float):
    """(local, peer) address → the round trip of the busiest connection of ``inodes`` to that peer among those that
    sent at least :data:`BUSY` bytes a second since the last poll (``before``: each connection's bytes acknowledged
    then; ``seconds`` since), and each connection's bytes acknowledged now. A connection to this node's own address,
    or loopback, is no link. The round trip of a connection that carries a few small messages is the peer's delayed
    acknowledgement and its scheduling as much as the link's: only a busy one says what the link does."""
    links: dict[tuple[str, str], tuple[float, float]] = {}
    acked = {}
    for c in connections:
        if c["inode"] not in inodes or c["rtt"] is None:
            continue
        acked[c["inode"]] = c["bytes_acked"]
        rate = (c["bytes_acked"] - before.get(c["inode"], c["bytes_acked"])) / max(seconds, 1e-3)
        if rate < BUSY or c["peer"] == c["local"] or ipaddress.ip_address(c["peer"]).is_loopback:
            continue
        key = (c["local"], c["peer"])
        if rate > links.get(key, (0.0, 0.0))[0]:
            links[key] = (rate, c["rtt"])
    return {key: rtt for key, (_, rtt) in links.items()}, acked


class LinkSource:
    """This node's busy job links (:func:`busy_links`), for the processes ``pids()`` gives (the job's, as
    kit.monitor.job.JobSource last found them; the exporter itself left out: its peer is Prometheus): each link's
    median round trip over its busy polls among the last :data:`POLLS` (one round trip swings 3-38 ms on a slow link
    under load, 0.1-2.8 ms on a healthy one; five give the link's level)."""

    name = "links"

    def __init__(self, pids):
        self.pids = pids
        self.acked: dict[int, int] = {}
        self.at = time.monotonic()
        self.polls = 0
        self.recent: dict[tuple[str, str], list[tuple[int, float]]] = {}  # link -> (poll, round trip), newest last

    def poll(self) -> SourceResult:
        t0 = time.perf_counter()
        mine = os.getpid()
        try:
            connections = tcp_connections()
        except OSError as e:
            return SourceResult([], False, time.perf_counter() - t0, str(e))
        now = time.monotonic()
        inodes = socket_inodes(p for p in self.pids() if p != mine)
        links, self.acked = busy_links(connections, inodes, self.acked, now - self.at)
        self.at, self.polls = now, self.polls + 1
        for key, rtt in links.items():
            self.recent.setdefault(key, []).append((self.polls, rtt))
        self.recent = {
            key: kept for key, seen in self.recent.items() if (kept := [x for x in seen if x[0] > self.polls - POLLS])
        }
        samples = [
            Sample(RTT, {"local": local, "peer": peer}, statistics.median(rtt for _, rtt in seen))
            for (local, peer), seen in sorted(self.recent.items())
        ]
        return SourceResult(samples, True, time.perf_counter() - t0)
