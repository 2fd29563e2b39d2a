"""kit's checkpoints (kit.train.checkpoint): a snapshot every step held beside the ranks, persisted by each node's
keeper to its disk, the next node and the job directory; a restart resumes from the nearest complete copy.

On the local cluster a lost node loses its processes and its node-local directories: the test kills the node's
ranks and keeper and removes the directories (its own: the tiers are put under the test's directory by
``KIT_CKPT_MEMORY`` and ``KIT_CKPT_LOCAL``), so its ranks' state can only come from the copy on its peer."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from pathlib import Path

import pytest
from helpers import check_end, kit, launch_wait, wait_for

from kit import files
from kit.monitor.training import GoodputSource
from kit.train import keeper as K
from kit.train import leftovers
from kit.train import snapshots as S

TRAIN = [sys.executable, "-m", "kit.train", "--log-every", "50", "--step-delay", "0.05"]


def tiers(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    memory, local = tmp_path / "shm", tmp_path / "disk"
    memory.mkdir(mode=0o700)
    local.mkdir(mode=0o700)
    return memory, local, [f"--checkpoint-memory={memory}", f"--checkpoint-local={local}"]


def newest(memory: Path, ranks: int = 0) -> int:
    """The newest step any rank has snapshotted (the tests' own memory tier); with ``ranks``, the newest step every
    one of them has (0 until each has one)."""
    steps: dict[int, int] = {}
    for p in memory.rglob("rank-*.json"):
        if m := re.fullmatch(r"rank-(\d+)\.step-(\d+)\.json", p.name):
            steps[int(m.group(1))] = max(steps.get(int(m.group(1)), 0), int(m.group(2)))
    if ranks:
        return min(steps.get(rank, 0) for rank in range(ranks))
    return max(steps.values(), default=0)


def loaded(job_dir: Path, run: int) -> dict[int, dict]:
    out = {}
    for p in (job_dir / "checkpoints").glob(f"loaded.r{run}.rank-*.json"):
        record = json.loads(p.read_text())
        out[record["rank"]] = record
    return out


def task_pids(job_dir: Path, run: int, node: str) -> list[int]:
    pids = []
    for p in (job_dir / "progress" / f"r{run}").glob("task-*"):
        words = p.read_text().split()
        if words and words[0] == node:
            pids.append(int(words[1]))
    return pids


def test_a_killed_rank_resumes_from_its_nodes_memory_losing_at_most_the_step_it_was_in(cluster, tmp_path):
    """A 2-node job of the reference trainer, 2 ranks a node; rank 1 is killed (SIGKILL) mid-run: the run restarts
    in the allocation on the same nodes, every rank loads the newest step from its node's memory tier (the dead
    rank's snapshot outlived it), at most one step short of the furthest any rank got, and the job completes."""
    memory, _, env = tiers(tmp_path)
    w = launch_wait(
        tmp_path,
        "--nodes", "2", "--ntasks-per-node", "2", "--on-failure", "restart", "--max-restarts", "1",
        command=[*TRAIN, "--max-steps", "300", *env],
    )  # fmt: skip
    # Every rank's snapshot of step 80 written (the ranks' writer threads trail one another by a step at times).
    wait_for(lambda: newest(memory, ranks=4) >= 80, 120, what="step 80 on every rank")
    os.kill(task_pids(w.job_dir, 0, "node1")[-1], signal.SIGKILL)
    said = check_end(cluster, w, state="COMPLETED", code=0, finished=True, log=None, ends=["failed", "finished"])
    restore = json.loads((w.job_dir / "checkpoints" / "restore.r1.json").read_text())
    told = f"run 1 resumed at step {restore['step']}, {restore['newest_held'] - restore['step']} step(s) redone, memory"
    assert told in said, said  # --wait's end line
    events = kit("events", str(w.job_dir)).stdout
    assert f"resumed at step {restore['step']}" in events and "checkpoints persisted every" in events, events
    report = kit("report", str(w.job_dir), "-o", str(tmp_path / "r.png"))
    assert f"run 1 resumed at step {restore['step']}" in report.stdout, report.stdout + report.stderr
    resumes = json.loads((tmp_path / "r.json").read_text())["goodput"]["resumes"]
    assert [(r["run"], r["step"], r["tiers"]) for r in resumes] == [(1, restore["step"], {"memory": 4})], resumes
    served = {(s.spec.name, s.labels.get("tier")): s.value for s in GoodputSource(w.job_dir).poll().samples}
    assert served[("kit_job_resume_redone_steps", "memory")] == restore["newest_held"] - restore["step"], served
    assert ("kit_job_resume_load_seconds", "memory") in served, served
    got, furthest = loaded(w.job_dir, 1), restore["newest_held"]
    assert sorted(got) == [0, 1, 2, 3], got
    assert {r["tier"] for r in got.values()} == {"memory"}, got
    assert {r["step"] for r in got.values()} == {restore["step"]}, (got, restore)
    assert furthest - restore["step"] <= 1, (furthest, restore)
    assert restore["step"] >= 80
    # The job's end is in the job directory (the shared tier), complete; the node tiers are gone.
    manifest = json.loads((w.job_dir / "checkpoints" / "step-300" / "manifest.json").read_text())
    assert manifest["world"] == 4 and len(manifest["shards"]) == 4, manifest
    assert not any((tmp_path / "shm").glob("kit-ckpt-*/*/*/memory/*.pt")), list((tmp_path / "shm").rglob("*"))
    decisions = (w.job_dir / "checkpoints" / "interval.jsonl").read_text().splitlines()
    assert decisions and "Young/Daly" in json.loads(decisions[0])["why"], decisions


def test_a_lost_node_is_recovered_on_a_spare_from_its_peers_copy(three, tmp_path):
    """--nodes 2 --spare-nodes 1: node1 is lost (its ranks and keeper killed, its memory and disk tiers removed);
    the run restarts on node2 and node3, the lost ranks' state comes from node2's copy of node1 (the peer tier),
    at most the chosen interval behind, and the job completes."""
    memory, local, env = tiers(tmp_path)
    w = launch_wait(
        tmp_path,
        "--nodes", "2", "--ntasks-per-node", "2", "--spare-nodes", "1", "--on-failure", "restart",
        "--max-restarts", "1",
        command=[*TRAIN, "--max-steps", "600", "--mtbf", "30", *env],
        env=three.env,
    )  # fmt: skip
    decided = w.job_dir / "checkpoints" / "interval.jsonl"

    def applied():  # the first interval kit chose is in force for two of its periods
        first = decided.exists() and decided.read_text().splitlines()[:1]
        return first and newest(memory) >= json.loads(first[0])["from_step"] + 2 * json.loads(first[0])["every_steps"]

    wait_for(applied, 120, what="the first interval kit chose in force")
    keeper = json.loads((w.job_dir / "checkpoints" / "keepers" / "r0" / "node1.json").read_text())
    os.kill(keeper["pid"], signal.SIGKILL)  # the node goes at once: no last pass
    for pid in task_pids(w.job_dir, 0, "node1"):
        os.kill(pid, signal.SIGKILL)
    for base in (memory, local):
        files.remove_tree(next(base.glob("kit-ckpt-*/*/node1")))
    check_end(three, w, state="COMPLETED", code=0, finished=True, log=None, ends=["failed", "finished"])
    restore = json.loads((w.job_dir / "checkpoints" / "restore.r1.json").read_text())
    got = loaded(w.job_dir, 1)
    every = max(json.loads(line)["every_steps"] for line in decided.read_text().splitlines())
    assert {r: got[r]["tier"] for r in (0, 1)} == {0: "peer", 1: "peer"}, got
    assert {got[r]["node"] for r in (0, 1)} == {"node2"}, got
    assert restore["sources"]["0"] == ["peer", "node2", "node1"], restore
    assert restore["newest_held"] - restore["step"] <= every, (restore, every)


def test_tiers_are_the_users_own_and_a_keeper_answers_only_its_job(tmp_path, monkeypatch):
    """A ``kit-ckpt-<uid>`` planted as a symlink is refused; a keeper answers only with the job's token; a torn
    or altered shard is never read; the restore picks the newest step every rank has on a tier still there."""
    monkeypatch.setenv("KIT_JOB_DIR", str(tmp_path / "job"))
    for name in ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "KIT_RESTART", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "shm").mkdir()
    os.symlink(elsewhere, tmp_path / "shm" / f"kit-ckpt-{os.geteuid()}")
    where = S.place()
    with pytest.raises(files.NotOwned):
        with S.node_dirs(where, {"KIT_CKPT_MEMORY": str(tmp_path / "shm"), "KIT_CKPT_LOCAL": str(tmp_path)}):
            pass
    assert list(elsewhere.iterdir()) == []
    with pytest.raises(SystemExit, match="nothing of it is used"):
        from kit.train import checkpoint

        checkpoint.Store({"KIT_CKPT_MEMORY": str(tmp_path / "shm"), "KIT_CKPT_LOCAL": str(tmp_path)})
    assert list(elsewhere.iterdir()) == []

    env = {"KIT_CKPT_MEMORY": str(tmp_path / "m"), "KIT_CKPT_LOCAL": str(tmp_path / "l")}
    with S.node_dirs(where, env) as dirs:
        S.write_shard(dirs[S.MEMORY], 0, 5, b"five", world=1)
        S.write_shard(dirs[S.MEMORY], 0, 6, b"six", world=1)
        (dirs[S.MEMORY] / "rank-0.step-7.pt").write_bytes(b"torn: no meta")
        assert sorted(S.shards(dirs[S.MEMORY])[0]) == [5, 6]
        (dirs[S.MEMORY] / "rank-0.step-6.pt").write_bytes(b"SIX")
        with pytest.raises(S.ShardError, match="not what its meta says"):
            S.read_shard(dirs[S.MEMORY], 0, 6)
        keeper = K.Keeper(where, dirs)
        server = K.Server(keeper)
        try:
            import threading

            threading.Thread(target=server.serve_forever, daemon=True).start()
            address = {"host": "127.0.0.1", "port": server.server_address[1]}
            request = {"op": "get", "tier": "memory", "from": where.node, "rank": 0, "step": 5}
            assert K.call(address, keeper.secret, request)[1] == b"five"
            with pytest.raises(S.ShardError, match="token"):
                K.call(address, "0" * 64, request)
            with pytest.raises(S.ShardError, match="not a node name"):
                K.call(address, keeper.secret, {**request, "tier": "peer", "from": "../../etc"})
        finally:
            server.shutdown()
            server.server_close()
        token = where.checkpoints / ".token"
        assert token.stat().st_mode & 0o777 == 0o600

    two = S.Place(where.job_dir, "k", 1, "n3", 0, 4, 0, ("n2", "n3"))
    held = {
        "n1": {"memory": {"0": [40, 41], "1": [40, 41]}},  # lost: not a node of this run
        "n2": {"memory": {"2": [40, 41], "3": [40, 41]}, "peer": {"n1": {"0": [36, 40], "1": [36, 40]}}},
    }
    step, sources = S.choose(two, held, set())
    assert step == 40 and sources[0] == ["peer", "n2", "n1"] and sources[2] == ["memory", "n2", "n2"], sources
    assert S.choose(two, {"n1": held["n1"]}, {30})[0] == 30  # only the shared tier is left
    assert S.choose(two, {"n1": held["n1"]}, set()) == (0, {})


def test_a_keeper_collects_its_users_tiers_no_keeper_holds(tmp_path, monkeypatch):
    """A cancelled job's snapshots stay in the node's memory (nothing runs after it on the node): the next keeper
    of the user's there removes the tiers of jobs no keeper holds once untouched 10 min (memory) or a day (disk);
    a tier a keeper holds (its run lock), or one touched lately, stays; and so does the key a job starting beside
    it has just made, before the node's directory in it (two jobs starting on one node: the second's keeper
    removed the first's bare key, whose rank then failed to make its tier: "No such file or directory")."""
    import fcntl
    import time

    monkeypatch.setenv("KIT_CKPT_MEMORY", str(tmp_path / "m"))
    monkeypatch.setenv("KIT_CKPT_LOCAL", str(tmp_path / "l"))
    root = tmp_path / "m" / f"kit-ckpt-{os.geteuid()}"
    for key in ("gone-1", "held-2", "fresh-3"):
        (root / key / "node1" / "memory").mkdir(parents=True)
        (root / key / "node1" / "memory" / "rank-0.step-5.pt").write_bytes(b"x")
        (root / key / "node1" / "keeper.r0").write_text("")
    root.chmod(0o700)
    (root / "starting-5").mkdir()
    (root / "idle-6").mkdir()
    old = time.time() - 3600
    for key in ("gone-1", "held-2"):
        for p in (root / key).rglob("*"):
            os.utime(p, (old, old))
    os.utime(root / "idle-6", (old, old))
    lock = os.open(root / "held-2" / "node1" / "keeper.r0", os.O_RDONLY)
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        where = S.Place(tmp_path / "job", "mine-4", 0, "node1", 0, 1, 0, ("node1",))
        gone = leftovers.collect(where)
    finally:
        os.close(lock)
    assert sorted(p.name for p in root.iterdir()) == ["fresh-3", "held-2", "starting-5"], gone
    assert gone == [f"{tmp_path / 'm'}/gone-1/node1"], gone
