"""``--preflight-network``: the job's nodes test their links together before the command starts.

One process per node (the node's local rank 0, in the job's own image), gloo over the address the job's rendezvous
uses: an all-reduce across every node, timed, then each pair of nodes alone (a round-robin schedule: in each round
every node is in at most one pair), a ping-pong of :data:`PAIR_BYTES` each way, timed; a node whose every link
looked slow then has its links timed again, apart (:func:`_confirm`). A node's record gets what it
measured (``network``: the all-reduce's seconds, its links' MB/s to each other node, or the error); the verdict
(:func:`kit.preflight.verdict.decide`) names a node whose every link is far slower than the job's median link —
a slow pair alone cannot say which end is slow, so two nodes are told their link's speed and never failed for it.
"""

from __future__ import annotations

import time
from datetime import timedelta

ALLREDUCE_BYTES = 4 << 20
PAIR_BYTES = 1 << 20
PING_PONGS = 3  # timed per pair, the best kept (a shared machine's time slice lowers one, not every one)
CONFIRMS = 3  # a node whose every link looked slow has each link timed again this many times, apart ...
CONFIRM_GAP = 0.3  # ... by this many seconds: a node starved of CPU for a moment is not a slow node
TIMEOUT = 60.0  # seconds to wait for every node to join (a node that never does fails the test where it runs)


def schedule(n: int) -> list[list[tuple[int, int]]]:
    """Rounds of pairs covering every pair of ``n`` ranks once (the circle method); a rank in at most one pair a
    round."""
    ranks = list(range(n)) + ([None] if n % 2 else [])
    m = len(ranks)
    rounds = []
    for _ in range(m - 1):
        pairs = [(ranks[i], ranks[m - 1 - i]) for i in range(m // 2)]
        rounds.append([(min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None])
        ranks = [ranks[0], ranks[-1], *ranks[1:-1]]
    return rounds


def run(address: str, rank: int, nodes: int, node: str, timeout: float = TIMEOUT) -> dict:
    """This node's part of the test: ``{"allreduce_seconds", "links": {other node: MB/s}, "seconds"}``, or
    ``{"error": …}`` when it could not be done (a node that never joined, a refused connection)."""
    t0 = time.monotonic()
    try:
        import torch
        import torch.distributed as dist

        host, _, port = address.rpartition(":")
        store = dist.TCPStore(host, int(port), nodes, rank == 0, timeout=timedelta(seconds=timeout))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=nodes, timeout=timedelta(seconds=timeout))
        try:
            names: list = [None] * nodes
            dist.all_gather_object(names, node)
            data = torch.ones(ALLREDUCE_BYTES // 4)
            dist.all_reduce(data)  # the connections made, once
            began = time.perf_counter()
            dist.all_reduce(data)
            allreduce = time.perf_counter() - began
            links = _confirm(dist, torch, rank, nodes, names, _pairs(dist, torch, rank, nodes, names))
            dist.barrier()
        finally:
            dist.destroy_process_group()
    except Exception as e:  # a test that could not run says why, in the record: the verdict weighs it
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]}
    return {"allreduce_seconds": round(allreduce, 4), "links": links, "seconds": round(time.monotonic() - t0, 3)}


def _pairs(dist, torch, rank: int, nodes: int, names: list) -> dict[str, float]:
    """This rank's links, each timed alone: MB/s of a ping-pong with the other end."""
    out = {}
    for pairs in schedule(nodes):
        for a, b in pairs:
            if rank in (a, b):
                out[str(names[b if rank == a else a])] = _ping_pong(dist, torch, rank, a, b, PING_PONGS)
        dist.barrier()  # the next round's pairs start together
    return out


def _ping_pong(dist, torch, rank: int, a: int, b: int, times: int, gap: float = 0.0) -> float:
    """MB/s of the best of ``times`` ping-pongs of :data:`PAIR_BYTES` between ranks ``a`` and ``b`` (this rank one
    of them), ``gap`` seconds apart, after one that warms the link."""
    other = b if rank == a else a
    send, got, best = torch.ones(PAIR_BYTES // 4), torch.empty(PAIR_BYTES // 4), float("inf")
    for i in range(1 + times):
        if i > 1:
            time.sleep(gap)
        began = time.perf_counter()
        if rank == a:
            dist.send(send, other)
            dist.recv(got, other)
        else:
            dist.recv(got, other)
            dist.send(send, other)
        best = min(best, time.perf_counter() - began) if i else float("inf")
    return round(2 * PAIR_BYTES / best / 1e6, 1)


def _confirm(dist, torch, rank: int, nodes: int, names: list, links: dict[str, float]) -> dict[str, float]:
    """Every node's links shared; a node whose every link looked slow (kit.preflight.verdict.every_link_slow) has
    each of its links timed again, pair by pair, :data:`CONFIRMS` times :data:`CONFIRM_GAP` apart, and each link
    keeps its best: a node whose process was starved of CPU during its first pairs (a busy host) is not failed for
    it, a slow link stays slow. Returns this rank's links."""
    from kit.preflight.verdict import every_link_slow

    shared: list = [None] * nodes
    dist.all_gather_object(shared, links)
    suspects = every_link_slow({str(names[r]): shared[r] for r in range(nodes)})
    for s in (r for r in range(nodes) if str(names[r]) in suspects):
        for other in (r for r in range(nodes) if r != s):
            a, b = min(s, other), max(s, other)
            if rank in (a, b):
                peer = str(names[b if rank == a else a])
                links[peer] = max(links[peer], _ping_pong(dist, torch, rank, a, b, CONFIRMS, CONFIRM_GAP))
            dist.barrier()
    return links
