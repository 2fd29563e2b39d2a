"""Code snapshots and image pins, without a cluster:
what a snapshot holds, how a view lays it out, the size limit, the store's sharing."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import kit

from kit.code import snapshot
from kit.errors import KitError
from kit.image import pin


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("KIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.email=t@kit", "-c", "user.name=t", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


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
    assert (clean.root, clean.source, clean.commit, clean.dirty) == (
        str(repo),
        "git",
        git(repo, "rev-parse", "HEAD"),
        False,
    )
    assert clean.files == 4  # .gitignore, link.py, run.sh, src/train.py: never data/ or *.log
    (repo / "src" / "train.py").write_text("print('edited')\n")
    (repo / "src" / "new.py").write_text("x = 1\n")  # untracked, not ignored
    dirty = snapshot.take(repo / "src", store=home / "code")
    assert dirty.dirty is True and dirty.files == 5 and dirty.digest != clean.digest

    view = tmp_path / "job" / "code"
    view.parent.mkdir()
    snapshot.materialize(dirty, view, tmp_path / "job" / "code.list")
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
    adds nothing; a view holds copies of its own (what a job writes there stays there)."""
    repo = make_repo(tmp_path / "repo")
    first = snapshot.take(repo, store=home / "code")
    before = objects(home)
    second = snapshot.take(repo, store=home / "code")
    assert second.digest == first.digest and objects(home) == before
    (repo / "src" / "train.py").write_text("print('two')\n")
    third = snapshot.take(repo, store=home / "code")
    assert len(objects(home) - before) == 1 and third.digest != first.digest  # only the changed file
    view = tmp_path / "v"
    snapshot.materialize(third, view, tmp_path / "code.list")
    copied = os.stat(view / "run.sh")
    assert copied.st_nlink == 1 and not copied.st_mode & 0o222 and copied.st_mode & 0o111  # read-only, executable
    assert not any(os.path.samestat(copied, os.stat(p)) for p in (home / "code" / "objects").iterdir())


def test_a_snapshot_over_the_limit_is_refused_naming_the_largest_files(home, tmp_path, monkeypatch):
    repo = make_repo(tmp_path / "repo")
    (repo / "weights.pt").write_bytes(b"w" * 5000)
    (repo / "src" / "table.csv").write_bytes(b"t" * 3000)
    monkeypatch.setenv("KIT_CODE_LIMIT", "4096")
    with pytest.raises(KitError) as e:
        snapshot.take(repo, store=home / "code")
    assert "weights.pt (4.9 KiB), src/table.csv (2.9 KiB)" in str(e.value) and "over its limit" in str(e.value)
    assert e.value.field == "--code" and ".gitignore" in e.value.hint
    proc = kit(
        "launch",
        "--dry-run",
        "--output-dir",
        str(tmp_path / "jobs"),
        "--",
        "true",
        cwd=repo,
        env={"KIT_CODE_LIMIT": "4096", "KIT_HOME": str(home)},
    )
    assert proc.returncode == 2 and proc.stderr.startswith("kit: --code: the code snapshot of"), proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "jobs").exists()  # nothing written
    ok = kit(
        "launch",
        "--dry-run",
        "--no-code-snapshot",
        "--output-dir",
        str(tmp_path / "jobs"),
        "--",
        "true",
        cwd=repo,
        env={"KIT_CODE_LIMIT": "4096", "KIT_HOME": str(home)},
    )
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
    proc = kit(
        "launch",
        "--dry-run",
        "--code",
        str(code),
        "--no-code-snapshot",
        "--",
        "true",
        cwd=code,
        env={"KIT_HOME": str(home)},
    )
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
    proc = kit(
        "launch",
        "--dry-run",
        "--output-dir",
        str(jobs),
        "--",
        "true",
        cwd=repo,
        env={"KIT_HOME": str(full_disk / "targets")},
    )
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


def test_a_job_writing_its_view_changes_no_store_object(home, tmp_path):
    """A view is a copy of its own. Whatever a job does to it (append, truncate,
    chmod, replace) the next snapshot of the untouched tree lays out the submitted content."""
    repo = make_repo(tmp_path / "repo")
    snap = snapshot.take(repo, store=home / "code")
    first = tmp_path / "one"
    first.mkdir()
    snapshot.materialize(snap, first / "code", first / "code.list")
    run = first / "code" / "run.sh"
    run.chmod(0o755)
    with open(run, "a") as f:
        f.write("echo CORRUPTED\n")
    (first / "code" / "src" / "train.py").chmod(0o644)
    (first / "code" / "src" / "train.py").write_text("")
    again = snapshot.take(repo, store=home / "code")
    assert again.digest == snap.digest and again.dirty is False
    second = tmp_path / "two"
    second.mkdir()
    snapshot.materialize(again, second / "code", second / "code.list")
    assert (second / "code" / "run.sh").read_text() == "#!/bin/sh\necho run\n"
    assert (second / "code" / "src" / "train.py").read_text() == "print('train')\n"


def test_a_damaged_object_is_never_copied_and_a_launch_heals_it(home, tmp_path):
    """Finding 1's third route and finding 13's twin: an object whose content is not its name
    (the owner wrote into the store) is refused by a view, and the next snapshot of a tree that
    still holds the content puts the object right."""
    repo = make_repo(tmp_path / "repo")
    snap = snapshot.take(repo, store=home / "code")
    for obj in (home / "code" / "objects").iterdir():
        obj.chmod(0o644)
        obj.write_text("echo EVIL\n")
    with pytest.raises(snapshot.Damaged, match="does not hold what its name says"):
        snapshot.materialize(snap, tmp_path / "view", tmp_path / "code.list")
    healed = snapshot.take(repo, store=home / "code")
    assert healed.digest == snap.digest
    snapshot.materialize(healed, tmp_path / "view2", tmp_path / "code2.list")
    assert (tmp_path / "view2" / "run.sh").read_text() == "#!/bin/sh\necho run\n"


def plant_manifest(home: Path, manifest: list) -> snapshot.Snapshot:
    text = json.dumps(manifest, separators=(",", ":")).encode()
    import hashlib

    digest = hashlib.sha256(text).hexdigest()
    (home / "code" / "manifests" / f"{digest}.json").write_bytes(text)
    return snapshot.Snapshot(f"sha256:{digest}", str(home), str(home / "code"), "git", len(manifest), 0)


@pytest.mark.parametrize(
    "entries",
    [
        [["../../../../victim/x", "l", "/etc/shadow"]],
        [["/abs/x", "l", "/etc/shadow"]],
        [["a", "l", "/etc"], ["a/passwd", "f", "0" * 64]],  # a file written through a planted link
        [["a/./b", "l", "x"]],
        [["ok", "f", "../../etc/passwd"]],  # an object name that is a path
    ],
)
def test_a_manifest_path_outside_the_view_is_refused(home, tmp_path, entries):
    repo = make_repo(tmp_path / "repo")
    snapshot.take(repo, store=home / "code")
    snap = plant_manifest(home, entries)
    with pytest.raises(KitError, match="damaged") as e:
        snapshot.load(snap.record())
    assert e.value.field == "JOB"
    with pytest.raises(KitError):
        snapshot.materialize(snap, tmp_path / "job" / "code", tmp_path / "code.list")
    assert not (tmp_path / "victim").exists() and not os.path.lexists(tmp_path / "job" / "code")


def test_a_manifest_that_is_not_its_name_is_refused(home, tmp_path):
    repo = make_repo(tmp_path / "repo")
    snap = snapshot.take(repo, store=home / "code")
    path = home / "code" / "manifests" / (snap.digest.split(":")[1] + ".json")
    path.write_text(path.read_text().replace("run.sh", "evil.sh"))
    with pytest.raises(KitError, match="does not hold what its name says"):
        snapshot.load(snap.record())


def test_a_pinned_image_is_trusted_by_content_not_name(home, tmp_path):
    """Finding 13: a pinned copy replaced or written in place is not used; the launch pins the
    file again (and names the pinned copy), a rerun of the pinned copy is refused."""
    image = tmp_path / "a.sqsh"
    image.write_bytes(b"image one")
    path, digest = pin.pin(image)
    path.chmod(0o644)
    path.write_bytes(b"evil image")
    again, digest2 = pin.pin(image)
    assert (again, digest2) == (path, digest) and again.read_bytes() == b"image one"  # replaced from the source
    tmp = path.with_name("x")
    tmp.write_bytes(b"evil two")
    os.replace(tmp, path)  # a new file under the old name
    with pytest.raises(KitError, match="does not hold what its name says") as e:
        pin.pin(path)
    assert str(path) in str(e.value)
    assert pin.pin(image)[0].read_bytes() == b"image one"


def test_a_dry_run_does_not_copy_the_image(home, tmp_path):
    """Finding 12's last part: --dry-run hashes the image, copies nothing."""
    image = tmp_path / "a.sqsh"
    image.write_bytes(b"image" * 1000)
    path, digest = pin.pin(image, copy=False)
    assert path == image and digest.startswith("sha256:") and not list((home / "images").glob("sha256-*"))
    assert pin.pin(image)[1] == digest


def test_a_work_tree_git_refuses_is_an_error_not_a_silent_live_run(home, tmp_path):
    """Finding 7: a teammate's repository (another owner: git's "dubious ownership") is never
    silently left unsnapshotted; --code DIR snapshots it as a plain directory."""
    repo = make_repo(tmp_path / "repo")
    for path in [repo, *repo.rglob("*")]:
        os.lchown(path, 4321, 4321)
    proc = kit(
        "launch",
        "--dry-run",
        "--output-dir",
        str(tmp_path / "jobs"),
        "--",
        "true",
        cwd=repo,
        env={"KIT_HOME": str(home)},
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"kit: --code: git refuses the work tree {repo}: another user owns it"), proc.stderr
    assert f"--code {repo}" in proc.stderr and "safe.directory" in proc.stderr and not (tmp_path / "jobs").exists()
    ok = kit(
        "launch",
        "--dry-run",
        "--code",
        str(repo),
        "--output-dir",
        str(tmp_path / "jobs"),
        "--",
        "true",
        cwd=repo,
        env={"KIT_HOME": str(home)},
    )
    assert ok.returncode == 0, ok.stderr
    job_dir = Path(ok.stdout.split("job dir: ")[1].strip())
    snap = snapshot.load(json.loads((job_dir / "job.json").read_text())["snapshot"])
    assert snap.source == "directory" and not (job_dir / "code").exists()  # a dry run's code stays in the store
    snapshot.materialize(snap, tmp_path / "view", tmp_path / "code.list")
    assert (tmp_path / "view" / "run.sh").read_text() == "#!/bin/sh\necho run\n"


def test_a_launch_never_rewrites_the_trees_index(home, tmp_path):
    """Finding 7's second half: `git status` refreshes a stale index by rewriting it (as root in a
    teammate's tree: an index they can no longer write). kit's git reads only."""
    import time

    repo = make_repo(tmp_path / "repo")
    time.sleep(1.1)
    (repo / "run.sh").touch()  # stat data differs from the index: git status would refresh it
    index = repo / ".git" / "index"
    before = os.stat(index)
    proc = kit(
        "launch",
        "--dry-run",
        "--output-dir",
        str(tmp_path / "jobs"),
        "--",
        "true",
        cwd=repo,
        env={"KIT_HOME": str(home)},
    )
    assert proc.returncode == 0, proc.stderr
    after = os.stat(index)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    git(repo, "status")  # the check above can fail: plain git status rewrites it
    assert os.stat(index).st_ino != before.st_ino


def test_a_dry_run_launch_copies_no_image(home, tmp_path):
    """Finding 12's last part, from the command line: `kit launch --dry-run --image` writes no pin."""
    root = tmp_path / "root"
    for rel in ("usr/bin/bash", "usr/bin/tee"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("")
    image = tmp_path / "img.sqsh"
    subprocess.run(["mksquashfs", str(root), str(image), "-quiet", "-no-progress"], check=True)
    proc = kit(
        "launch",
        "--dry-run",
        "--no-code-snapshot",
        "--image",
        str(image),
        "--output-dir",
        str(tmp_path / "jobs"),
        "--",
        "true",
        env={"KIT_HOME": str(home)},
    )
    assert proc.returncode == 0, proc.stderr
    assert not list((home / "images").glob("sha256-*")), list((home / "images").iterdir())
    job_dir = Path(proc.stdout.split("job dir: ")[1].strip())
    spec = json.loads((job_dir / "job.json").read_text())
    assert spec["image_digest"].startswith("sha256:") and spec["image"] == str(image)


def test_a_file_deleted_while_the_tree_is_read_is_not_part_of_it(home, tmp_path, monkeypatch):
    """A file listed and then gone before it was read (another process's temporary tree beside
    the code, as a base image's build leaves while it runs) is left out, not an error."""
    repo = make_repo(tmp_path / "repo")
    (repo / "build.tmp").mkdir()
    (repo / "build.tmp" / "Packages.xz").write_bytes(b"p" * 100)
    real = snapshot._entries

    def listed_then_deleted(root, names, label):
        out = real(root, names, label)
        (repo / "build.tmp" / "Packages.xz").unlink()
        (repo / "build.tmp").rmdir()
        return out

    monkeypatch.setattr(snapshot, "_entries", listed_then_deleted)
    taken = snapshot.take(repo, store=home / "code")
    view = tmp_path / "v"
    snapshot.materialize(taken, view, tmp_path / "code.list")
    assert taken.files == 4 and (view / "src" / "train.py").read_text() == "print('train')\n"
    assert not os.path.lexists(view / "build.tmp" / "Packages.xz")


def test_a_git_that_does_not_answer_is_one_message(home, tmp_path, monkeypatch):
    """git asked for the tree's files and state and silent for its 2 minutes: one error naming the tree and the way
    around it, never a traceback."""
    repo = make_repo(tmp_path / "repo")
    real = snapshot._git

    for question in ("rev-parse", "ls-files"):  # where the tree's top is (never then the live files), its files

        def silent(args, cwd, wait=True, question=question):
            if args[0] == question:
                raise subprocess.TimeoutExpired(["git", *args], 120)
            return real(args, cwd, wait)

        monkeypatch.setattr(snapshot, "_git", silent)
        with pytest.raises(KitError) as e:
            snapshot.take(repo, store=home / "code")
        assert str(e.value) == f"git did not answer within 120 s in {repo}" and "--no-code-snapshot" in e.value.hint
