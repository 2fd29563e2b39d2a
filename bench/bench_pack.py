"""Packing benchmark: each `kit build --compression` choice on the same tree, side by side.

    python bench/bench_pack.py [--rootfs DIR | --image IMAGE.sqsh] [--runs 3] [--choices a,b,...] [--quick]

--quick: once, on a tiny generated tree (the test suite's run: the bench keeps working).

--image unpacks a built image (e.g. the README's cpu-lightning.sqsh, the tree
the pack was measured on) and benchmarks on its tree.

For every choice: mksquashfs time (all cores, -all-root, as kit packs), image
size, unpack time (`unsquashfs` into a fresh directory after dropping the
page cache, which is what `enroot create` does at every job start on every
node: pyxis's create mode), and the read through FUSE (pyxis's squashfuse
mode: a fresh `squashfuse` mount, page cache dropped, then `import torch,
lightning` in the tree when it has them, else every file read). Then kit's
default against enroot's own `-comp lzo -noD`, with the pack's targets
(size <= 0.4x, pack <= 0.25x, unpack <= 1.0x), and against zstd-fast (kit's
earlier default) through FUSE. Runs of the choices are interleaved
so all see the same machine load.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from common import tiny_rootfs  # noqa: E402

from kit.image.recipe import COMPRESSION, DEFAULT_COMPRESSION  # noqa: E402

CHOICES = ("enroot", "lz4", "lz4-fast", "zstd-fast", "zstd")
# In a tree with Python, torch and Lightning: what a training job reads at its start.
IMPORT = (
    'mount -t proc proc "$1/proc" && mount -t tmpfs tmpfs "$1/tmp" && mount --rbind /dev "$1/dev" && '
    "chroot \"$1\" python3 -c 'import torch, lightning'"
)


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def timed(argv) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def read_all(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            with open(path, "rb") as f:
                while f.read(1 << 20):
                    pass


def fuse_read(image: Path, mnt: Path, python: bool) -> float | None:
    """Seconds to read through a fresh squashfuse mount of ``image`` (None without squashfuse or root)."""
    if not shutil.which("squashfuse") or os.geteuid() != 0:
        return None
    mnt.mkdir(exist_ok=True)
    subprocess.run(["squashfuse", str(image), str(mnt)], check=True)
    try:
        drop_caches()
        t0 = time.perf_counter()
        if python:
            subprocess.run(
                ["unshare", "-m", "sh", "-c", IMPORT, "sh", str(mnt)],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        else:
            read_all(mnt)
        return time.perf_counter() - t0
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rootfs", default=str(REPO / "containers" / "bases" / "debian-bookworm"))
    ap.add_argument("--image", default=None, help="benchmark on the tree of this built image")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--choices", default=",".join(CHOICES))
    ap.add_argument("--quick", action="store_true", help="once, on a tiny tree (the test suite's run)")
    args = ap.parse_args()
    choices = tuple(args.choices.split(","))
    scratch = tempfile.TemporaryDirectory()
    if args.quick:
        args.runs, args.rootfs = 1, str(tiny_rootfs(Path(scratch.name)))
    rootfs = Path(args.rootfs)
    if args.image:
        rootfs = Path(scratch.name) / "tree"
        subprocess.run(
            ["unsquashfs", "-no-progress", "-d", str(rootfs), args.image], check=True, stdout=subprocess.DEVNULL
        )
    if not rootfs.is_dir():
        sys.exit(f"no root filesystem at {rootfs}: run containers/bases/debian-bookworm.sh first")
    tree = int(subprocess.run(["du", "-sb", str(rootfs)], capture_output=True, text=True).stdout.split()[0])
    pack, unpack, size, fuse = ({c: [] for c in choices} for _ in range(4))
    python = (rootfs / "usr" / "bin" / "python3").exists() and any(rootfs.glob("usr/*/lib/python3*/*-packages/torch"))
    cold = True
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for run in range(args.runs):
            for c in choices if run % 2 == 0 else tuple(reversed(choices)):
                image = tmp / f"{c}.sqsh"
                pack[c].append(
                    timed(
                        [
                            "mksquashfs",
                            str(rootfs),
                            str(image),
                            "-noappend",
                            "-all-root",
                            "-processors",
                            str(os.cpu_count()),
                            "-no-progress",
                            "-quiet",
                            *COMPRESSION[c],
                        ]
                    )
                )
                size[c].append(image.stat().st_size)
                cold = drop_caches() and cold
                unpack[c].append(timed(["unsquashfs", "-no-progress", "-d", str(tmp / f"{c}.out"), str(image)]))
                shutil.rmtree(tmp / f"{c}.out")
                fuse[c].append(fuse_read(image, tmp / "mnt", python))
                image.unlink()
    med = statistics.median
    print(
        f"tree: {rootfs} ({tree / 2**20:.0f} MiB), runs: {args.runs}, cores: {os.cpu_count()}, "
        f"page cache {'dropped before each unpack' if cold else 'NOT dropped (no permission): unpack times are warm'}"
    )
    what = "import torch, lightning" if python else "read every file"
    print(f"{'choice':<12}{'mksquashfs options':<44}{'pack':>9}{'size':>10}{'unpack':>9}   through FUSE ({what})")
    for c in choices:
        read = "-" if None in fuse[c] else f"{med(fuse[c]):.2f}s"
        print(
            f"{c:<12}{' '.join(COMPRESSION[c]):<44}{med(pack[c]):>8.2f}s{med(size[c]) / 2**20:>7.0f}MiB"
            f"{med(unpack[c]):>8.2f}s   {read:>8}"
        )
    new, old = DEFAULT_COMPRESSION, "enroot"
    ratios = {
        "size": (med(size[new]) / med(size[old]), 0.40),
        "pack": (med(pack[new]) / med(pack[old]), 0.25),
        "unpack": (med(unpack[new]) / med(unpack[old]), 1.0),
    }
    print(f"default {new!r} against enroot's -comp lzo -noD:")
    for what, (ratio, target) in ratios.items():
        print(f"  {what:<7}{ratio:>6.2f}x   target <= {target:.2f}x   {'met' if ratio <= target else 'MISSED'}")
    if "zstd-fast" in choices and new != "zstd-fast" and None not in fuse[new] + fuse["zstd-fast"]:
        ratio = med(fuse[new]) / med(fuse["zstd-fast"])
        print(
            f"default {new!r} against 'zstd-fast' through FUSE: {ratio:.2f}x the time, "
            f"{med(size[new]) / med(size['zstd-fast']):.2f}x the size, {med(pack[new]) / med(pack['zstd-fast']):.2f}x "
            "the pack time"
        )
    scratch.cleanup()


if __name__ == "__main__":
    main()
