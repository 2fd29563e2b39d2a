"""A node's checkpoint keeper (``python -m kit.train.keeper``): the per-node side of kit's checkpoints (no torch).

Started by the node's first rank that opens :mod:`kit.train.checkpoint` (one per node and run: a lock in the
node's memory tier), ended with that rank (its parent's death is its TERM). In the background of the training it:

- persists the ranks' snapshots (the memory tier) on the interval kit chooses: to the node's disk, to the next
  node's keeper over the job's network (a token from the job directory asked of every request), and every K-th
  one (and any snapshot a rank marks final: the warning's save) to the job directory, with a manifest once every
  rank's shard and copy are written;
- answers other nodes: their copies to keep, and any shard it holds to a rank that loads it;
- says what it holds (``checkpoints/held/<node>.json``) and where it answers (``checkpoints/keepers/r<run>/``);
- on the job's first node, chooses the interval (Young/Daly from the measured costs and the time between
  failures) and records each choice and why (``checkpoints/interval.jsonl``).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import re
import secrets
import socket
import socketserver
import sys
import threading
import time
from pathlib import Path

from kit import files
from kit.jobdir import JobDir
from kit.stopping import Stop
from kit.train import interval, leftovers
from kit.train import snapshots as S

HEADER_LIMIT = 1 << 16
NODE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
KEEP = 2  # each rank's newest shards kept on each tier
PASS = 0.2  # seconds between two looks at the node's snapshots: a due step reaches the peer this much later


# --- the token and the wire -------------------------------------------------------------------------------


def token(where: S.Place) -> str:
    """The job's keeper secret (``checkpoints/.token``, 0600, made once by the first keeper)."""
    path = where.checkpoints / JobDir.CKPT_TOKEN
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        files.create(path, secrets.token_hex(32), 0o600)
    value = S.wait_for(lambda: files.read_text(path, 256).strip(), 10)
    if len(value) != 64:
        raise OSError(f"{path}: not a keeper token")
    return value


def _send(sock: socket.socket, header: dict, body: bytes = b"") -> None:
    sock.sendall(json.dumps(header).encode() + b"\n" + body)


def _receive(stream) -> tuple[dict, bytes]:
    line = stream.readline(HEADER_LIMIT)
    if not line.endswith(b"\n"):
        raise OSError("no header")
    header = json.loads(line)
    size = int(header.get("meta", {}).get("bytes", 0)) if header.get("body") else 0
    body = stream.read(size) if size else b""
    if len(body) != size:
        raise OSError("the body ended early")
    return header, body


def call(address: dict, secret: str, request: dict, body: bytes = b"", timeout: float = 60) -> tuple[dict, bytes]:
    """One request to a keeper: its answer's header and body."""
    with socket.create_connection((address["host"], int(address["port"])), timeout=timeout) as sock:
        _send(sock, {**request, "token": secret, "body": bool(body)}, body)
        answer, data = _receive(sock.makefile("rb"))
    if not answer.get("ok"):
        raise S.ShardError(f"keeper {address['host']}:{address['port']}: {answer.get('error', 'refused')}")
    return answer, data


def address_of(where: S.Place, node: str, wait: float) -> dict:
    path = where.checkpoints / JobDir.CKPT_KEEPERS / JobDir.RUN.format(run=where.run) / f"{node}.json"
    found = S.wait_for(lambda: S.read_json(path), wait, 0.2)
    if not found:
        raise S.ShardError(f"node {node}'s keeper did not answer within {wait:.0f} s ({path})")
    return found


def own_address() -> str:
    """The address other nodes reach this one by: the one it reaches the rendezvous from."""
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((master, int(os.environ.get("MASTER_PORT", "9") or 9)))
        return s.getsockname()[0]
    return "127.0.0.1"


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, keeper: Keeper):
        self.keeper = keeper
        super().__init__(("0.0.0.0", 0), Handler)


class Handler(socketserver.StreamRequestHandler):
    def handle(self):
        keeper = self.server.keeper
        try:
            header, body = _receive(self.rfile)
            if not hmac.compare_digest(str(header.get("token", "")), keeper.secret):
                raise PermissionError("not this job's token")
            answer, data = keeper.answer(header, body)
        except (OSError, ValueError, KeyError, TypeError) as e:
            answer, data = {"ok": False, "error": str(e)[:300]}, b""
        with contextlib.suppress(OSError):
            _send(self.connection, answer, data)


# --- the keeper -------------------------------------------------------------------------------------------


class Keeper:
    def __init__(self, where: S.Place, dirs: dict[str, Path]):
        self.where, self.dirs = where, dirs
        self.secret = token(where)
        self.persisted: set[tuple[int, int]] = set()  # (rank, step) on the local and peer tiers
        self.shared: set[tuple[int, int]] = set()
        self.costs = {"local": [], "shared": []}  # seconds per persisted shard
        # Until decided (in this run): the last run's decision, else every step and the shared tier only at the end.
        self.chosen = interval.decisions(where)
        self.decided_at: float | None = None
        self.lock = threading.Lock()

    # answering other nodes
    def answer(self, header: dict, body: bytes) -> tuple[dict, bytes]:
        op, rank, step = header.get("op"), int(header["rank"]), int(header["step"])
        origin = str(header.get("from", ""))
        if not NODE_NAME.fullmatch(origin):
            raise ValueError("not a node name")
        if op == "put":
            meta = dict(header["meta"], copied_from=origin)
            directory = self.dirs[S.PEER] / origin
            directory.mkdir(exist_ok=True, mode=0o700)
            S.write_shard(
                directory,
                rank,
                step,
                body,
                **{k: v for k, v in meta.items() if k not in ("bytes", "sha256", "rank", "step")},
            )
            if S.read_shard(directory, rank, step)[1]["sha256"] != meta.get("sha256"):
                S.remove_shard(directory, rank, step)
                raise S.ShardError("the copy does not match its digest")
            S.prune(directory, KEEP)
            return {"ok": True}, b""
        if op == "get":
            tier = header.get("tier")
            directory = self.dirs[S.PEER] / origin if tier == S.PEER else self.dirs.get(tier)
            if directory is None or tier == S.SHARED:
                raise ValueError(f"no tier {tier!r} here")
            data, meta = S.read_shard(directory, rank, step)
            return {"ok": True, "meta": meta, "body": True}, data
        raise ValueError(f"no such request {op!r}")

    # persisting
    def due(self, step: int, meta: dict) -> tuple[bool, bool]:
        return interval.due(self.chosen, step, bool(meta.get("final")))

    def persist(self, rank: int, step: int, meta: dict, to_shared: bool) -> None:
        data, meta = S.read_shard(self.dirs[S.MEMORY], rank, step)
        extra = {k: meta[k] for k in ("world", "time", "final") if k in meta}
        began = time.monotonic()
        if (rank, step) not in self.persisted:
            S.write_shard(self.dirs[S.LOCAL], rank, step, data, **extra)
            copied = self.push(rank, step, data, meta)
            self.persisted.add((rank, step))
            self.costs["local"].append(time.monotonic() - began)
            S.prune(self.dirs[S.LOCAL], KEEP)
        else:
            copied = True
        if to_shared and (rank, step) not in self.shared:
            began = time.monotonic()
            directory = self.where.checkpoints / JobDir.CKPT_STEP.format(step=step)
            directory.mkdir(parents=True, exist_ok=True)
            S.write_shard(directory, rank, 0, data, **extra, copied=copied, node=self.where.node)
            self.shared.add((rank, step))
            self.costs["shared"].append(time.monotonic() - began)
            self.seal(directory, step)

    def push(self, rank: int, step: int, data: bytes, meta: dict) -> bool:
        """This node's shard to its peer's keeper; False when there is no peer or it did not take it."""
        if self.where.peer is None:
            return False
        try:
            address = address_of(self.where, self.where.peer, 30)
            request = {"op": "put", "from": self.where.node, "rank": rank, "step": step, "meta": meta}
            call(address, self.secret, request, data)
            return True
        except (OSError, ValueError) as e:
            print(f"kit.train.keeper: rank {rank} step {step} not copied to {self.where.peer}: {e}", flush=True)
            return False

    def seal(self, directory: Path, step: int) -> None:
        """The manifest, once every rank's shard (and its copy, when there is a peer) is in ``directory``."""
        found = S.shards(directory)
        metas = {rank: steps[0] for rank, steps in found.items() if 0 in steps}
        if len(metas) != self.where.world or (self.where.peer and not all(m.get("copied") for m in metas.values())):
            return
        manifest = {
            "step": step,
            "world": self.where.world,
            "shards": {
                str(r): {"sha256": m["sha256"], "bytes": m["bytes"], "node": m.get("node")} for r, m in metas.items()
            },
        }
        with contextlib.suppress(FileExistsError):
            files.create(directory / JobDir.CKPT_MANIFEST, json.dumps(manifest), 0o600)
        if self.where.node == self.where.nodes[0]:
            self.drop_old_shared()

    def drop_old_shared(self) -> None:
        complete = sorted(S.shared_steps(self.where))
        for step in complete[:-KEEP]:
            files.remove_tree(self.where.checkpoints / JobDir.CKPT_STEP.format(step=step))

    def one_pass(self) -> bool:
        """Persist what is due; True when anything was."""
        did = False
        memory = S.shards(self.dirs[S.MEMORY])
        for rank, steps in memory.items():
            newest = sorted(steps)[-KEEP:]
            for step in sorted(steps):
                local, shared = self.due(step, steps[step])
                if local and ((rank, step) not in self.persisted or (shared and (rank, step) not in self.shared)):
                    with contextlib.suppress(S.ShardError):
                        self.persist(rank, step, steps[step], shared)
                        did = True
                if step not in newest and (rank, step) in self.persisted:
                    S.remove_shard(self.dirs[S.MEMORY], rank, step)
        return did

    # saying what it holds
    def holdings(self) -> dict:
        def steps(directory):
            return {str(r): sorted(s) for r, s in S.shards(directory).items()}

        peer = {}
        with contextlib.suppress(OSError):
            for p in self.dirs[S.PEER].iterdir():
                peer[p.name] = steps(p)
        return {
            "node": self.where.node,
            "run": self.where.run,
            "time": time.time(),
            S.MEMORY: steps(self.dirs[S.MEMORY]),
            S.LOCAL: steps(self.dirs[S.LOCAL]),
            S.PEER: peer,
            "plan": self.chosen[-1] if self.chosen else None,
        }

    def say_held(self) -> None:
        S.write_json(self.where.checkpoints / JobDir.CKPT_HELD / f"{self.where.node}.json", self.holdings())

    # the interval
    def follow_plan(self) -> None:
        """The first node decides (a new interval applies from a step ahead); the others read its decisions."""
        if self.where.node != self.where.nodes[0]:
            self.chosen = interval.decisions(self.where)
            return
        if self.decided_at is not None and time.monotonic() - self.decided_at < 5:
            return
        decision = interval.decide(self.where, self.costs, S.shards(self.dirs[S.MEMORY]))
        self.decided_at = None if decision is None else time.monotonic()  # not measured yet: at the next pass
        last = self.chosen[-1] if self.chosen else {}
        if decision and changed(last, decision):
            path = self.where.checkpoints / JobDir.CKPT_INTERVAL
            path.parent.mkdir(parents=True, exist_ok=True)
            files.append(path, json.dumps(decision) + "\n", 0o600)
            self.chosen.append(decision)


def changed(last: dict, decision: dict) -> bool:
    """A new interval is worth telling every node: the shared tier's cadence moved, or the interval by over 25 %."""
    if not last:
        return True
    before, now = int(last["every_steps"]), int(decision["every_steps"])
    return last["shared_every"] != decision["shared_every"] or abs(now - before) > max(before // 4, 0)


def ended(dirs: dict[str, Path]) -> bool:
    """Every rank of this node ended its work: its newest snapshot is its end's."""
    memory = S.shards(dirs[S.MEMORY])
    return bool(memory) and all(steps[max(steps)].get("final") == "end" for steps in memory.values())


def serve(where: S.Place, dirs: dict[str, Path], stopping: Stop, parent: int) -> None:
    keeper = Keeper(where, dirs)
    server = Server(keeper)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
    S.write_json(
        where.checkpoints / JobDir.CKPT_KEEPERS / JobDir.RUN.format(run=where.run) / f"{where.node}.json",
        {"host": own_address(), "port": server.server_address[1], "pid": os.getpid()},
    )
    keeper.say_held()
    for gone in leftovers.collect(where):
        print(f"kit.train.keeper: removed {gone}: no keeper has held it for a while", flush=True)
    said = time.monotonic()
    while not stopping.is_set() and os.getppid() == parent:
        keeper.follow_plan()
        if (keeper.one_pass() and time.monotonic() - said > 1) or time.monotonic() - said > 2:
            keeper.say_held()  # at most once a second: a file of the job directory, on shared storage
            said = time.monotonic()
        stopping.wait(PASS)
    keeper.one_pass()  # a final snapshot (the warning's save) is persisted before the keeper goes
    keeper.say_held()
    server.shutdown()
    if ended(dirs):
        leftovers.clean(where)
        with contextlib.suppress(FileNotFoundError):  # it holds nothing now
            os.unlink(where.checkpoints / JobDir.CKPT_HELD / f"{where.node}.json")


def main(argv=None) -> int:
    """``--parent PID``: the rank that started it; the keeper's last pass runs when it is gone."""
    argv = sys.argv[1:] if argv is None else argv
    parent = int(argv[argv.index("--parent") + 1]) if "--parent" in argv else os.getppid()
    where = S.place()
    stopping = Stop()  # TERM, INT, HUP; never an Event set from a handler (kit.stopping says why)
    with S.node_dirs(where) as dirs:
        serve(where, dirs, stopping, parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
