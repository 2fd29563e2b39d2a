"""Where a job's checkpoint shards live, tier by tier, and which step a run resumes from (no torch).

A shard is one rank's state at one step: ``rank-<R>.step-<N>.pt`` (the bytes) and ``rank-<R>.step-<N>.json`` (its
meta: step, rank, world, size, sha256), the meta written after the bytes, so a shard without its meta is torn and
never read. The tiers, nearest first:

- ``memory``: the node's shared memory (``$KIT_CKPT_MEMORY``, default ``/dev/shm``): a rank's snapshot of every
  step, which outlives the rank (a rank that dies loses at most the step it was in);
- ``local``: the node's own disk (``$KIT_CKPT_LOCAL``, default ``$TMPDIR`` or ``/var/tmp``), every persisted step;
- ``peer``: the same shards on the next node of the job, sent by its keeper over the job's network;
- ``shared``: the job directory (``checkpoints/step-<N>/``), every K-th persisted step and the last, complete
  only once its manifest is written (every rank's shard and its peer copy are).

Per node both the memory and local trees are ``<base>/kit-ckpt-<uid>/<job key>/<node>/``: a directory of this
user's own, checked before anything in it is used (another user on a shared node cannot plant or swap it). The
job key is the job id and a digest of the job directory: two local clusters' job 1 do not share one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from kit import files
from kit.jobdir import JobDir

MEMORY, LOCAL, PEER, SHARED = "memory", "local", "peer", "shared"
TIERS = (MEMORY, LOCAL, PEER, SHARED)  # nearest first
SHARD = re.compile(
    re.escape(JobDir.CKPT_SHARD).replace(r"\{rank\}", r"(\d{1,6})").replace(r"\{step\}", r"(\d{1,12})") + r"\.json"
)
META_LIMIT = 1 << 16
JOB = "job"  # <key>/job: the job directory the key is of
IDLE = {MEMORY: 600.0, LOCAL: 86400.0}  # a node's tiers of a job no keeper holds go once untouched this long


class ShardError(OSError):
    """A shard that is missing, torn or not what its meta says."""


@dataclass(frozen=True)
class Place:
    """Where this process is: the job, its run, this node and rank, the step's nodes in order."""

    job_dir: Path
    key: str
    run: int
    node: str
    rank: int
    world: int
    local_rank: int
    nodes: tuple[str, ...]
    slurm: bool = True  # in a Slurm job (else one process on this host: each start a run of its own)

    @property
    def peer(self) -> str | None:
        """The node that keeps this node's copies: the next of the step's nodes (None alone)."""
        if len(self.nodes) < 2 or self.node not in self.nodes:
            return None
        return self.nodes[(self.nodes.index(self.node) + 1) % len(self.nodes)]

    @property
    def checkpoints(self) -> Path:
        return self.job_dir / JobDir.CHECKPOINTS


def expand_nodes(text: str) -> list[str]:
    """A Slurm host list (``node[1-3,7],gpu2``) as names, in order."""
    out: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]*)\])?(?:,|$)", text.strip()):
        prefix, ranges = m.group(1), m.group(2)
        if ranges is None:
            out.append(prefix)
            continue
        for part in ranges.split(","):
            first, _, last = part.partition("-")
            for i in range(int(first), int(last or first) + 1):
                out.append(f"{prefix}{i:0{len(first)}d}")
    return out


def place(env=None) -> Place:
    """This process's place, from the launcher's variables (outside a job: one rank on this host)."""
    env = os.environ if env is None else env
    job_dir = Path(env.get("KIT_JOB_DIR", ".")).absolute()
    node = env.get("SLURMD_NODENAME") or socket.gethostname()
    nodes = tuple(expand_nodes(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "")) or (node,)
    digest = hashlib.sha256(str(job_dir).encode()).hexdigest()[:10]
    return Place(
        job_dir=job_dir,
        key=files.safe_name(f"{env.get('SLURM_JOB_ID', 'local')}-{digest}"),
        run=int(env.get("KIT_RESTART", "0") or 0),
        node=node,
        rank=int(env.get("RANK", "0")),
        world=int(env.get("WORLD_SIZE", "1")),
        local_rank=int(env.get("LOCAL_RANK", "0")),
        nodes=nodes,
        slurm="SLURM_JOB_ID" in env,
    )


def bases(env=None) -> dict[str, Path]:
    """The node-local bases of the memory and local tiers."""
    env = os.environ if env is None else env
    return {
        MEMORY: Path(env.get("KIT_CKPT_MEMORY") or "/dev/shm"),
        LOCAL: Path(env.get("KIT_CKPT_LOCAL") or env.get("TMPDIR") or "/var/tmp"),
    }


def user_root(base: Path) -> Path:
    """This user's directory below a tier's base (``kit-ckpt-<uid>``): the one every use checks is its own."""
    return base / f"kit-ckpt-{os.geteuid()}"


@contextlib.contextmanager
def node_dirs(where: Place, env=None) -> Iterator[dict[str, Path]]:
    """This node's tier directories (memory, local, and the peer copies it keeps for others), each below a
    ``kit-ckpt-<uid>`` directory checked to be this user's own and written through the checked descriptor."""
    with contextlib.ExitStack() as stack:
        out = {}
        found = bases(env)
        for tier, base in found.items():
            try:
                root = stack.enter_context(files.owned(user_root(base)))
            except files.NotOwned:
                raise  # another user's, or open to others: never used, never worked around
            except OSError as e:  # no such place here (an image without /dev/shm): the node's disk holds both
                if tier != MEMORY:
                    raise
                print(f"kit.train.checkpoint: {base} cannot hold the snapshots ({e}): using {found[LOCAL]}", flush=True)
                root = stack.enter_context(files.owned(user_root(found[LOCAL])))
            out[tier] = root / where.key / where.node / tier
            out[tier].mkdir(parents=True, exist_ok=True, mode=0o700)
            if not (root / where.key / JOB).exists():  # whose the key is (kit's clean-up of the suite's jobs reads it)
                files.write_atomic(root / where.key / JOB, str(where.job_dir), 0o600)
        out[PEER] = out[LOCAL].parent / PEER
        out[PEER].mkdir(exist_ok=True, mode=0o700)
        yield out


# --- shards -----------------------------------------------------------------------------------------------


def shard_name(rank: int, step: int) -> str:
    return JobDir.CKPT_SHARD.format(rank=rank, step=step)


def write_shard(directory: Path, rank: int, step: int, data: bytes, **meta) -> dict:
    """The bytes, then the meta that makes them a shard (a crash between leaves a torn one nobody reads)."""
    record = {"rank": rank, "step": step, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), **meta}
    files.write_atomic(directory / f"{shard_name(rank, step)}.pt", data, 0o600)
    files.write_atomic(directory / f"{shard_name(rank, step)}.json", json.dumps(record), 0o600)
    return record


def shards(directory: Path) -> dict[int, dict[int, dict]]:
    """Every complete shard's meta in ``directory``: {rank: {step: meta}}."""
    out: dict[int, dict[int, dict]] = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return out
    for name in names:
        if not (m := SHARD.fullmatch(name)):
            continue
        try:
            meta = files.read_json(directory / name, META_LIMIT)
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict) and meta.get("rank") == int(m.group(1)) and meta.get("step") == int(m.group(2)):
            out.setdefault(int(m.group(1)), {})[int(m.group(2))] = meta
    return out


def read_shard(directory: Path, rank: int, step: int) -> tuple[bytes, dict]:
    """A shard's bytes and meta, checked against the meta's size and digest."""
    try:
        meta = files.read_json(directory / f"{shard_name(rank, step)}.json", META_LIMIT)
        data = files.read_bytes(directory / f"{shard_name(rank, step)}.pt", int(meta["bytes"]) + 1)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ShardError(f"no shard of rank {rank} at step {step} in {directory}: {e}") from None
    if len(data) != meta["bytes"] or hashlib.sha256(data).hexdigest() != meta.get("sha256"):
        raise ShardError(f"the shard of rank {rank} at step {step} in {directory} is not what its meta says")
    return data, meta


def remove_shard(directory: Path, rank: int, step: int) -> None:
    for suffix in (".json", ".pt"):  # the meta first: a shard is never seen whole while going
        with contextlib.suppress(FileNotFoundError):
            os.unlink(directory / f"{shard_name(rank, step)}{suffix}")


def prune(directory: Path, keep: int, spare: set[int] = frozenset()) -> None:
    """Keep each rank's ``keep`` newest shards (and those of the ``spare`` steps)."""
    for rank, steps in shards(directory).items():
        for step in sorted(steps)[:-keep] if keep else sorted(steps):
            if step not in spare:
                remove_shard(directory, rank, step)


# --- the job directory's records --------------------------------------------------------------------------


def write_json(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_atomic(path, json.dumps(value, sort_keys=True), 0o600)


def read_json(path: Path) -> dict:
    return files.read_record(path, 1 << 20)


def held(where: Place) -> dict[str, dict]:
    """Each node's last word on what it holds: {node: {"run", "time", "memory"|"local": {rank: [steps]},
    "peer": {from node: {rank: [steps]}}}}."""
    out = {}
    directory = where.checkpoints / JobDir.CKPT_HELD
    with contextlib.suppress(OSError):
        for p in directory.iterdir():
            if p.suffix == ".json" and (value := read_json(p)).get("node") == p.stem:
                out[p.stem] = value
    return out


def shared_steps(where: Place) -> set[int]:
    """The steps complete on shared storage: a manifest for this world, every rank's shard listed in it."""
    out = set()
    with contextlib.suppress(OSError):
        for p in where.checkpoints.iterdir():
            m = re.fullmatch(r"step-(\d{1,12})", p.name)
            manifest = read_json(p / JobDir.CKPT_MANIFEST) if m else {}
            if manifest.get("world") == where.world and len(manifest.get("shards", {})) == where.world:
                out.add(int(m.group(1)))
    return out


def choose(where: Place, holdings: dict[str, dict], complete_shared: set[int]) -> tuple[int, dict[int, list]]:
    """The newest step every rank can load from a tier still there, and each rank's nearest source
    ``[tier, node, from node]`` (a node of this run's; shared: no node). (0, {}): nothing to resume from."""
    per_node = max(where.world // max(len(where.nodes), 1), 1)
    candidates: dict[int, dict[int, list]] = {}  # rank -> step -> best source
    for node, record in holdings.items():
        if node not in where.nodes:
            continue  # a lost node's memory and disk are gone with it
        sources = [(MEMORY, node, rank, steps) for rank, steps in record.get(MEMORY, {}).items()]
        sources += [(LOCAL, node, rank, steps) for rank, steps in record.get(LOCAL, {}).items()]
        for origin, ranks in record.get(PEER, {}).items():
            sources += [(PEER, node, rank, steps, origin) for rank, steps in ranks.items()]
        for tier, at, rank, steps, *origin in sources:
            rank = int(rank)
            here = where.nodes.index(at) == rank // per_node
            cost = (0 if here else 1, TIERS.index(tier))
            for step in steps:
                best = candidates.setdefault(rank, {}).get(step)
                if best is None or cost < best[0]:
                    candidates[rank][step] = (cost, [tier, at, origin[0] if origin else at])
    for rank in range(where.world):
        for step in complete_shared:
            candidates.setdefault(rank, {}).setdefault(step, ((2, 3), [SHARED, None, None]))
    return _newest_common(where, candidates)


def newest_held(holdings: dict[str, dict]) -> int:
    """The newest step any tier of any node was last said to hold (a lost node's too): how far the job got."""
    steps = [0]
    for record in holdings.values():
        for tier in (MEMORY, LOCAL):
            steps += [s for ranks in [record.get(tier, {})] for got in ranks.values() for s in got]
        steps += [s for ranks in record.get(PEER, {}).values() for got in ranks.values() for s in got]
    return max(steps)


def _newest_common(where: Place, candidates: dict[int, dict[int, tuple]]) -> tuple[int, dict[int, list]]:
    common = set.intersection(*(set(candidates.get(r, {})) for r in range(where.world))) if where.world else set()
    if not common:
        return 0, {}
    step = max(common)
    return step, {r: candidates[r][step][1] for r in range(where.world)}


def wait_for(check, seconds: float, every: float = 0.1):
    """``check()``'s first true value within ``seconds`` (else its last)."""
    deadline = time.monotonic() + seconds
    while not (value := check()) and time.monotonic() < deadline:
        time.sleep(every)
    return value
