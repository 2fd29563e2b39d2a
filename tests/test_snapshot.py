"""Code snapshots and image pins (issue 22, done-means 3 and 5's no-copy half), without a cluster:
what a snapshot holds, how a view lays it out, the size limit, the store's sharing."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import kit

from kit import snapshot
from kit.errors import KitError
from kit.image import pin


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("KIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@kit", "-c", "user.name=t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def make_repo(path: Path) -> Path:
    (path / "src").mkdir(parents=True)
    (path / "data").mkdir()
    (path / "src" / "train.py").write_text("print('train')\n")
    (path / "run.sh").write_text("#!/bin/sh\necho run\n")
    (path / "run.sh").chmod(0o755)
    (path / ".gitignore").write_text("data/\n*.log\n")
    (path / "data" / "big.bin").write_bytes(b"x" * 1000)
    (path / "src" / "debug.log").write_text("ignored\n")
    os.symlink("src/train.py", path / "link.py")
    git(path, "init", "-q")
    git(path, "add", ".")
    git(path, "commit", "-qm", "one")
    return path


def objects(home: Path) -> set[str]:
    return {p.name for p in (home / "code" / "objects").iterdir() if not p.name.startswith(".")}


def test_a_snapshot_holds_tracked_and_unignored_files_as_they_are(home, tmp_path):
    repo = make_repo(tmp_path / "repo")
    clean = snapshot.take(repo / "src", store=home / "code")
    assert (clean.root, clean.source, clean.commit, clean.dirty) == (str(repo), "git", git(repo, "rev-parse", "HEAD"),
                                                                     False)
    assert clean.files == 4  # .gitignore, link.py, run.sh, src/train.py: never data/ or *.log
    (repo / "src" / "train.py").write_text("print('edited')\n")
    (repo / "src" / "new.py").write_text("x = 1\n")  # untracked, not ignored
    dirty = snapshot.take(repo / "src", store=home / "code")
    assert dirty.dirty is True and dirty.files == 5 and dirty.digest != clean.digest

    view = tmp_path / "job" / "code"
    view.parent.mkdir()
    snapshot.materialize(dirty, view)
    assert (view / "src" / "train.py").read_text() == "print('edited')\n"
    assert (view / "src" / "new.py").read_text() == "x = 1\n"
    assert os.readlink(view / "link.py") == "src/train.py"  # a tracked symlink stays one
    assert (view / "run.sh").stat().st_mode & 0o111 and not (view / "src" / "new.py").stat().st_mode & 0o111
    # What the snapshot leaves out is reachable where it was (live); the repository itself is not.
    assert os.readlink(view / "data") == str(repo / "data") and (view / "data" / "big.bin").stat().st_size == 1000
    assert os.readlink(view / "src" / "debug.log") == str(repo / "src" / "debug.log")
    assert not os.path.lexists(view / ".git")
    assert snapshot.workdir(dirty, view, repo / "src") == view / "src"
    # A file edited after the snapshot does not reach it.
    (repo / "src" / "train.py").write_text("print('later')\n")
    assert (view / "src" / "train.py").read_text() == "print('edited')\n"


def test_unchanged_content_is_never_copied_again(home, tmp_path):
    """The store keeps one read-only copy per content; a second snapshot of an unchanged tree
    adds nothing, and a view links to the store instead of copying."""
    repo = make_repo(tmp_path / "repo")
    first = snapshot.take(repo, store=home / "code")
    before = objects(home)
    second = snapshot.take(repo, store=home / "code")
    assert second.digest == first.digest and objects(home) == before
    (repo / "src" / "train.py").write_text("print('two')\n")
    third = snapshot.take(repo, store=home / "code")
    assert len(objects(home) - before) == 1 and third.digest != first.digest  # only the changed file
    view = tmp_path / "v"
    snapshot.materialize(third, view)
    linked = os.stat(view / "run.sh")
    assert linked.st_nlink >= 2 and not linked.st_mode & 0o222  # a hard link to the read-only object
    assert any(os.path.samestat(linked, os.stat(p)) for p in (home / "code" / "objects").iterdir())


def test_a_snapshot_over_the_limit_is_refused_naming_the_largest_files(home, tmp_path, monkeypatch):
    repo = make_repo(tmp_path / "repo")
    (repo / "weights.pt").write_bytes(b"w" * 5000)
    (repo / "src" / "table.csv").write_bytes(b"t" * 3000)
    monkeypatch.setenv("KIT_CODE_LIMIT", "4096")
    with pytest.raises(KitError) as e:
        snapshot.take(repo, store=home / "code")
    assert "weights.pt (4.9 KiB), src/table.csv (2.9 KiB)" in str(e.value) and "over its limit" in str(e.value)
    assert e.value.field == "--code" and ".gitignore" in e.value.hint
    proc = kit("launch", "--dry-run", "--output-dir", str(tmp_path / "jobs"), "--", "true", cwd=repo,
               env={"KIT_CODE_LIMIT": "4096", "KIT_HOME": str(home)})
    assert proc.returncode == 2 and proc.stderr.startswith("kit: --code: the code snapshot of"), proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "jobs").exists()  # nothing written
    ok = kit("launch", "--dry-run", "--no-code-snapshot", "--output-dir", str(tmp_path / "jobs"), "--", "true",
             cwd=repo, env={"KIT_CODE_LIMIT": "4096", "KIT_HOME": str(home)})
    assert ok.returncode == 0, ok.stderr
    job_dir = Path(ok.stdout.split("job dir: ")[1].strip())
    assert "snapshot" not in json.loads((job_dir / "job.json").read_text()) and not (job_dir / "code").exists()
    assert f"--chdir={repo}" in ok.stdout


def test_code_dir_outside_a_git_tree_and_the_launch_directory(home, tmp_path):
    code = tmp_path / "code"
    (code / "sub").mkdir(parents=True)
    (code / "sub" / "a.py").write_text("a\n")
    (code / "__pycache__").mkdir()
    (code / "__pycache__" / "a.pyc").write_bytes(b"\0")
    snap = snapshot.take(code / "sub", str(code), store=home / "code")
    assert (snap.source, snap.files, snap.commit, snap.dirty) == ("directory", 1, None, None)
    with pytest.raises(KitError, match="outside"):
        snapshot.take(tmp_path, str(code), store=home / "code")
    assert snapshot.take(tmp_path, store=home / "code") is None  # no git work tree, no --code: nothing to snapshot
    proc = kit("launch", "--dry-run", "--code", str(code), "--no-code-snapshot", "--", "true", cwd=code,
               env={"KIT_HOME": str(home)})
    assert proc.returncode == 2 and "contradict" in proc.stderr


def test_an_image_file_is_pinned_by_content(home, tmp_path):
    image = tmp_path / "a.sqsh"
    image.write_bytes(b"image one")
    path, digest = pin.pin(image)
    assert path.read_bytes() == b"image one" and digest.startswith("sha256:") and path.parent == home / "images"
    image.write_bytes(b"image two")  # rebuilt in place
    assert path.read_bytes() == b"image one"
    path2, digest2 = pin.pin(image)
    assert digest2 != digest and path2.read_bytes() == b"image two"
    assert pin.pin(path) == (path, digest)  # a pinned copy names itself (kit rerun)


def test_a_full_store_is_one_line_and_nothing_is_written(tmp_path, full_disk):
    """The store's disk full: kit launch says so in one line, exit 1, nothing written."""
    repo = make_repo(tmp_path / "repo")
    jobs = full_disk / "targets" / "jobs"
    proc = kit("launch", "--dry-run", "--output-dir", str(jobs), "--", "true", cwd=repo,
               env={"KIT_HOME": str(full_disk / "targets")})
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("kit: --code: cannot ") and "No space left on device" in proc.stderr
    assert "Traceback" not in proc.stderr and not any(p.name.startswith("kit-") for p in jobs.glob("*"))


def test_the_store_is_on_the_job_directories_file_system(tmp_path, full_disk, monkeypatch):
    """A view hard-links into its store: $KIT_HOME/code when it shares the jobs' file system,
    else a store of the user's own beside the jobs (no copy per job across file systems)."""
    monkeypatch.setenv("KIT_HOME", str(tmp_path / "home"))
    assert snapshot.store_for(tmp_path / "jobs" / "deeper") == tmp_path / "home" / "code"
    monkeypatch.setenv("KIT_HOME", str(full_disk / "targets"))  # another file system (a tmpfs)
    assert snapshot.store_for(tmp_path / "jobs") == tmp_path / "jobs" / f".kit-code-{os.geteuid()}"
    repo = make_repo(tmp_path / "repo")
    planted = tmp_path / "jobs" / f".kit-code-{os.geteuid()}"
    planted.mkdir(parents=True, mode=0o777)
    planted.chmod(0o777)  # anyone could swap its objects: refused
    with pytest.raises(KitError, match="not a directory of this user's own"):
        snapshot.take(repo, store=planted)


def test_a_job_never_snapshots_earlier_jobs(home, tmp_path):
    """The default output directory, ./kit-jobs, inside a work tree that does not ignore it: the
    jobs (and a store beside them) stay out of every later snapshot."""
    repo = make_repo(tmp_path / "repo")
    specs = []
    for _ in range(2):
        proc = kit("launch", "--dry-run", "--", "true", cwd=repo, env={"KIT_HOME": str(home)})
        assert proc.returncode == 0, proc.stderr
        job_dir = Path(proc.stdout.split("job dir: ")[1].strip())
        specs.append(json.loads((job_dir / "job.json").read_text())["snapshot"])
    assert job_dir.parent == repo / "kit-jobs" and specs[0]["digest"] == specs[1]["digest"]
    assert specs[1]["files"] == 4 and specs[1]["dirty"] is False  # the jobs are not a change to the tree
