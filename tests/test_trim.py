"""`kit trim` frees the pinned images and code snapshots no
job needs, and keeps those a held job and a requeueable one (ended unfinished, still known to
Slurm) use, and those of a job named with --keep."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from helpers import kit, scancel, wait_for

import kit as kitlib
from kit.image import pin
from kit.job import trim as trimming


def fake_image(tmp_path: Path, name: str) -> Path:
    """A squashfs with what kit's pre-submission check looks for (bash, tee), unique content."""
    root = tmp_path / f"{name}-root"
    for rel in ("usr/bin/bash", "usr/bin/tee"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("")
    (root / "id").write_text(name)
    out = tmp_path / f"{name}.sqsh"
    subprocess.run(["mksquashfs", str(root), str(out), "-quiet", "-no-progress"], check=True)
    return out


def repo(tmp_path: Path, name: str, text: str) -> Path:
    r = tmp_path / name
    r.mkdir()
    (r / "train.py").write_text(text)
    subprocess.run(["git", "-C", str(r), "init", "-q"], check=True)
    return r


def objects_of(job: kitlib.Job) -> set[str]:
    snap = json.loads((job.dir / "job.json").read_text())["snapshot"]
    manifest = Path(snap["store"]) / "manifests" / (snap["digest"].split(":")[1] + ".json")
    return {value for _, kind, value in json.loads(manifest.read_text()) if kind in ("f", "x")}


def test_trim_frees_what_no_job_needs_and_keeps_held_and_requeueable_jobs(cluster, tmp_path, monkeypatch):
    out = tmp_path / "jobs"

    def launch(code: Path, image: Path | None, *extra: str) -> kitlib.Job:
        args = ["launch", "--local", "--no-exporter", "--output-dir", str(out), *extra]
        proc = kit(*args, *(["--image", str(image)] if image else []), "--", "python3", "train.py", cwd=code)
        assert proc.returncode == 0, proc.stderr
        return kitlib.Job.from_dir(proc.stdout.split("job dir: ")[1].splitlines()[0].strip())

    held = launch(repo(tmp_path, "held", "print('held')\n"), fake_image(tmp_path, "held"), "--sbatch-arg=--hold")
    failed = launch(
        repo(tmp_path, "failed", "print('failed')\n"), fake_image(tmp_path, "failed"), "--max-restarts", "1"
    )
    end = failed.wait(timeout=180)
    assert end.state == "FAILED" and not (failed.dir / "FINISHED").exists()  # requeueable: Slurm knows it
    done = launch(repo(tmp_path, "done", "print('done')\n"), None, "--wait")
    named = launch(repo(tmp_path, "named", "print('named')\n"), None, "--wait")
    free_pin, _ = pin.pin(fake_image(tmp_path, "free"))
    pins = {j: Path(json.loads((j.dir / "job.json").read_text())["image"]) for j in (held, failed)}
    assert all(p.parent == pin.pins() for p in pins.values())

    uses = {j: objects_of(j) for j in (held, failed, done, named)}
    monkeypatch.setattr(trimming, "GRACE", 0.0)  # what was written just now counts as old here
    dry = trimming.trim([out], [named.dir], dry_run=True)
    assert str(free_pin) in dry.images and free_pin.exists() and dry.freed > 0
    result = trimming.trim([out], [named.dir])
    assert str(free_pin) in result.images and not free_pin.exists()
    assert all(p.exists() for p in pins.values()), result  # the held job's and the requeueable one's
    assert {str(held.dir), str(failed.dir), str(named.dir)} <= set(result.kept_for)
    store = Path(json.loads((done.dir / "job.json").read_text())["snapshot"]["store"])
    left = {p.name.split(".")[0] for p in (store / "objects").iterdir()}
    assert uses[done] & left == set() and result.objects >= 1 and result.snapshots >= 1  # the finished job's code
    assert (uses[held] | uses[failed] | uses[named]) <= left
    # What was kept still runs: the held job, released, starts (its image and its code are there).
    subprocess.run(["scontrol", "release", held.id], env={**__import__("os").environ, **cluster.target.env}, check=True)
    wait_for(lambda: held.state() != "PENDING", 120, what="the held job to start")
    scancel(cluster, held.id)
    proc = kit("trim", "--output-dir", str(out), "--dry-run")
    assert proc.returncode == 0 and proc.stdout.startswith("kit trim: would free "), proc.stderr


def test_trim_waits_for_a_launch_reusing_objects_before_its_manifest_names_them(tmp_path, monkeypatch):
    """A launch reuses an object already in the store (an old one, which no manifest names any more) and
    names it in its manifest only once every object is stored. `kit trim` in between removed it, and the
    launch then failed ("lost the object"). The launch holds the store shared while it stores; trim takes
    it exclusive, so it waits, then sees the new manifest and keeps what it names."""
    import threading
    import time

    from kit.code import snapshot as snapshots

    monkeypatch.setenv("KIT_HOME", str(tmp_path / "home"))
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("print('mine')\n")
    snap = snapshots.take(work, str(work), store=tmp_path / "home" / "code")
    store = Path(snap.store)
    manifest = store / "manifests" / (snap.digest.split(":")[1] + ".json")
    text = manifest.read_bytes()
    manifest.unlink()  # the earlier job's snapshot trimmed: its object is old and no manifest names it
    (obj,) = list((store / "objects").iterdir())
    monkeypatch.setattr(trimming, "_old", lambda p: p.parent.name == "objects")  # old objects, new manifests
    reusing, trimming_started, done = threading.Event(), threading.Event(), []

    def launch():
        from kit import files
        from kit.code import store as codestore

        with codestore.opened(store, create=False) as (_, objects, manifests):
            assert (objects / obj.name).exists()  # reused, not written again
            reusing.set()
            trimming_started.wait(10)
            time.sleep(0.5)  # trim is under way meanwhile
            files.write_atomic(manifests / manifest.name, text, 0o600)

    def trim():
        reusing.wait(10)
        trimming_started.set()
        done.append(trimming.trim([tmp_path / "jobs"]))

    threads = [threading.Thread(target=launch), threading.Thread(target=trim)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert done and obj.exists() and manifest.exists(), done
    assert done[0].objects == 0


def test_trim_frees_the_trees_a_login_node_laid_out_but_those_a_job_runs_from(tmp_path, monkeypatch):
    """On a login node each `kit --host … launch` lays its snapshot out as a tree ($KIT_HOME/trees/<checkout>/
    <digest>, the job's snapshot root); only the oldest beyond three per checkout went, so a checkout not launched
    again kept its trees for ever, and `kit --host … trim` was refused. trim frees every tree no job needs (unused
    for GRACE), keeps the one a kept job runs from; --dry-run only counts; over --host it runs on the login node."""
    import os

    from kit.cli.group import _on_the_login_node

    home = tmp_path / "home"
    monkeypatch.setenv("KIT_HOME", str(home))
    trees = home / "trees" / "repo-0123abcd"
    for name in ("aaaa", "bbbb"):
        (trees / name / "src").mkdir(parents=True)
        (trees / name / "src" / "train.py").write_text("print('hi')\n")
    job = tmp_path / "job"
    job.mkdir()
    (job / "job.json").write_text(
        json.dumps(
            {
                "snapshot": {
                    "digest": "sha256:" + "0" * 64,
                    "root": str(trees / "bbbb"),
                    "store": str(home / "code"),
                    "source": "git",
                    "files": 1,
                    "bytes": 12,
                }
            }
        )
    )
    monkeypatch.setattr(trimming, "_old", lambda p: True)
    dry = trimming.trim([tmp_path / "jobs"], keep=[job], dry_run=True)
    assert (dry.trees, dry.freed) == (1, 12) and (trees / "aaaa").is_dir()
    out = trimming.trim([tmp_path / "jobs"], keep=[job])
    assert out.trees == 1 and not (trees / "aaaa").exists()
    assert (trees / "bbbb" / "src" / "train.py").read_text() == "print('hi')\n"
    monkeypatch.setattr(trimming, "_old", lambda p: os.path.basename(p) != "bbbb")
    assert trimming.trim([tmp_path / "jobs"]).trees == 0 and (trees / "bbbb").is_dir()  # used lately: kept
    assert _on_the_login_node(["--host", "login", "trim", "--dry-run"]) == ("login", ["trim", "--dry-run"])
