"""Code snapshots and image pins: time and bytes per job, side by side
with the ways other tools package code (NeMo-Run's `git archive`, a plain copy).

    python bench/bench_snapshot.py [--files 1000] [--mb 100] [--runs 3] [--quick]

--quick: 100 files / 5 MB, one run each (the test suite's run: the bench keeps working).

For a git repository of N files / M MB (committed; one of them edited between jobs):
1. kit's snapshot + view per job, cold store (first job), unchanged tree (second job) and one file
   edited (third job); target: under 1 s each.
2. bytes kit adds to its store per job (target: 0 for unchanged content) and bytes the view copies
   (every snapshotted file: a view is a copy of its own, so that a job writing into
   its code changes no other job; each copy is checked against its content's name).
3. the same jobs packaged by `git archive HEAD | tar -x` and by `cp -a` into a job directory.
4. `--image` pinning of an M MB file: first submission (a copy) and the next (the stat memo).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def make_repo(root: Path, files: int, megabytes: int) -> None:
    size = megabytes * (1 << 20) // files
    for i in range(files):
        d = root / f"pkg{i % 20}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"mod{i}.py").write_bytes(os.urandom(size))
    git = ["git", "-C", str(root), "-c", "user.email=b@kit", "-c", "user.name=b"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "bench"], check=True)


def store_bytes(home: Path) -> int:
    objects = home / "code" / "objects"  # KIT_HOME and the jobs share a file system here
    return sum(p.stat().st_size for p in objects.iterdir()) if objects.is_dir() else 0


def copied_bytes(view: Path) -> int:
    """Bytes of the regular files in a view (its copies; links to the live tree not counted)."""
    total = 0
    for dirpath, _, names in os.walk(view):
        for n in names:
            if not os.path.islink(os.path.join(dirpath, n)):
                total += os.lstat(os.path.join(dirpath, n)).st_size
    return total


def kit_job(repo: Path, jobs: Path, i: int) -> tuple[float, int, int]:
    """(seconds for snapshot + view, bytes added to the store, bytes copied into the view)."""
    from kit.code import snapshot

    home = Path(os.environ["KIT_HOME"])
    before = store_bytes(home)
    t0 = time.perf_counter()
    snap = snapshot.take(repo, store=snapshot.store_for(jobs))
    view = jobs / f"kit-{i}" / "code"
    view.parent.mkdir(parents=True)
    snapshot.materialize(snap, view, view.parent / "code.list")
    seconds = time.perf_counter() - t0
    return seconds, store_bytes(home) - before, copied_bytes(view)


def git_archive_job(repo: Path, jobs: Path, i: int) -> float:
    out = jobs / f"git-{i}"
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    subprocess.run(f"git -C {repo} archive HEAD | tar -x -C {out}", shell=True, check=True)
    return time.perf_counter() - t0


def copy_job(repo: Path, jobs: Path, i: int) -> float:
    t0 = time.perf_counter()
    subprocess.run(["cp", "-a", str(repo), str(jobs / f"cp-{i}")], check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="100 files / 5 MB, one run (the test suite's run)")
    args = ap.parse_args()
    if args.quick:
        args.files, args.mb, args.runs = 100, 5, 1
    rows: dict[str, list] = {k: [] for k in ("cold", "unchanged", "edited", "git", "cp", "pin1", "pin2")}
    for _run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="kit-bench-snap-") as tmp:
            tmp = Path(tmp)
            os.environ["KIT_HOME"] = str(tmp / "home")
            repo, jobs = tmp / "repo", tmp / "jobs"
            make_repo(repo, args.files, args.mb)
            time.sleep(2.1)  # past the memo's racy window, as a tree edited minutes before a launch is
            rows["cold"].append(kit_job(repo, jobs, 0))
            rows["unchanged"].append(kit_job(repo, jobs, 1))
            edited = next((repo / "pkg0").iterdir())
            edited.write_bytes(os.urandom(edited.stat().st_size))
            rows["edited"].append(kit_job(repo, jobs, 2))
            rows["git"].append(git_archive_job(repo, jobs, 0))
            rows["cp"].append(copy_job(repo, jobs, 0))
            from kit.image import pin

            image = tmp / "image.sqsh"
            image.write_bytes(os.urandom(args.mb << 20))
            time.sleep(2.1)
            t0 = time.perf_counter()
            pin.pin(image)
            rows["pin1"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            pin.pin(image)
            rows["pin2"].append(time.perf_counter() - t0)

    def med(key: str, i: int | None = None) -> float:
        return statistics.median(r[i] if i is not None else r for r in rows[key])

    size = f"{args.files} files / {args.mb} MB"
    print(f"repository: {size}, git, committed; runs: {args.runs} (median shown)")
    print(f"{'per job':<46}{'time':>9}{'store +':>12}{'view copied':>13}{'target':>16}")
    for key, what in (
        ("cold", "kit snapshot + view, first job (cold store)"),
        ("unchanged", "kit, next job, unchanged"),
        ("edited", "kit, next job, one file edited"),
    ):
        print(
            f"{what:<46}{med(key, 0):>8.3f}s{med(key, 1) / 2**20:>9.2f} MB{med(key, 2) / 2**20:>10.2f} MB"
            f"{'< 1 s' + (', 0 MB' if key == 'unchanged' else ''):>16}"
        )
    print(f"{'git archive HEAD | tar -x (NeMo-Run)':<46}{med('git'):>8.3f}s{'':>12}{args.mb:>10.1f} MB")
    print(f"{'cp -a of the tree':<46}{med('cp'):>8.3f}s{'':>12}{args.mb:>10.1f} MB")
    print(f"{'  ratio kit unchanged / git archive':<46}{med('unchanged', 0) / med('git'):>8.2f}x")
    print(f"{'--image pin, first submission (copy)':<46}{med('pin1'):>8.3f}s  ({args.mb} MB file)")
    print(f"{'--image pin, next submission (stat memo)':<46}{med('pin2'):>8.3f}s{'':>25}{'< 0.01 s':>16}")
    ok = (
        all(med(k, 0) < 1.0 for k in ("cold", "unchanged", "edited"))
        and med("unchanged", 1) == 0
        and med("pin2") < 0.01
    )
    print("targets met" if ok else "TARGETS MISSED")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()
