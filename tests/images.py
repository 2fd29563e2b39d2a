"""Test helpers that make images and image trees: a tiny root filesystem,
OCI layouts and docker archives written byte by byte, tree comparison."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path


def tiny_rootfs(dest: Path) -> Path:
    """A root with /bin/sh (the host's dash and its libraries) and little else."""
    dash = Path(shutil.which("dash") or "/bin/dash").resolve()
    (dest / "bin").mkdir(parents=True)
    shutil.copy2(dash, dest / "bin" / "sh")
    for tool in ("cat", "mkdir"):
        shutil.copy2(Path(shutil.which(tool)).resolve(), dest / "bin" / tool)
    libs = set()
    for binary in (dash, Path(shutil.which("cat")).resolve(), Path(shutil.which("mkdir")).resolve()):
        out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
        for line in out.splitlines():
            for part in line.split():
                if part.startswith("/"):
                    libs.add(part)
    for lib in libs:
        target = dest / lib.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(lib).resolve(), target)
    for d in ("etc", "tmp", "dev", "proc", "sys"):
        (dest / d).mkdir(exist_ok=True)
    (dest / "etc" / "os-release").write_text("ID=tiny\n")
    return dest


def tar_bytes(entries: list[tuple]) -> bytes:
    """entries: (name, kind, payload, mode) with kind file|dir|symlink|hardlink."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, payload, mode in entries:
            info = tarfile.TarInfo(name)
            info.mode = mode
            info.mtime = 1_600_000_000
            data = None
            if kind == "file":
                data = payload.encode() if isinstance(payload, str) else payload
                info.size = len(data)
            elif kind == "dir":
                info.type = tarfile.DIRTYPE
            elif kind == "symlink":
                info.type = tarfile.SYMTYPE
                info.linkname = payload
            elif kind == "hardlink":
                info.type = tarfile.LNKTYPE
                info.linkname = payload
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


LAYER1 = [
    ("etc", "dir", None, 0o755),
    ("etc/os-release", "file", "ID=layered\n", 0o644),
    ("a", "dir", None, 0o755),
    ("a/x", "file", "x1\n", 0o644),
    ("a/y", "file", "y1\n", 0o600),
    ("b", "dir", None, 0o755),
    ("b/old", "file", "old\n", 0o644),
    ("b/sub", "dir", None, 0o755),
    ("b/sub/deep", "file", "deep\n", 0o644),
    ("bin", "dir", None, 0o755),
    ("bin/tool", "file", "#!/bin/sh\necho tool\n", 0o755),
    ("bin/tool-link", "hardlink", "bin/tool", 0o755),
    ("c", "symlink", "a", 0o777),
    ("abs", "symlink", "/etc/os-release", 0o777),
    ("gone-dir", "dir", None, 0o755),
    ("gone-dir/f", "file", "f\n", 0o644),
    ("dev", "dir", None, 0o755),
    ("dev/null-ish", "file", "dropped\n", 0o644),
]
LAYER2 = [
    ("a/.wh.x", "file", "", 0o644),  # delete a/x
    ("b/.wh..wh..opq", "file", "", 0o644),  # empty b of the lower layer
    ("b/new", "file", "new\n", 0o644),
    ("a/y", "file", "y2\n", 0o640),  # replace, new mode
    ("c", "file", "c is a file now\n", 0o644),  # symlink replaced by a file
    (".wh.gone-dir", "file", "", 0o644),  # delete a whole directory
    ("bin/tool2", "hardlink", "bin/tool", 0o755),  # hard link to a lower-layer file
    ("setuid", "file", "s\n", 0o4755),
]
CONFIG = {
    "architecture": "amd64",
    "os": "linux",
    "config": {
        "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "GREETING=hello world"],
        "WorkingDir": "/srv/app",
        "Entrypoint": ["/bin/tool", "--flag"],
        "Cmd": ["it's", "two words"],
        "Volumes": {"/var/data": {}, "/cache": {}},
        "Labels": {"maintainer": "kit", "version": "1"},
    },
    "rootfs": {"type": "layers", "diff_ids": []},
}


def _blob(layout: Path, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    d = layout / "blobs" / "sha256"
    d.mkdir(parents=True, exist_ok=True)
    (d / digest).write_bytes(data)
    return f"sha256:{digest}"


def oci_layout(layout: Path, layers=(LAYER1, LAYER2), config=CONFIG, tag="test") -> Path:
    layer_data = [tar_bytes(layer) for layer in layers]
    cfg = json.loads(json.dumps(config))
    cfg["rootfs"]["diff_ids"] = ["sha256:" + hashlib.sha256(d).hexdigest() for d in layer_data]
    layer_descs = [
        {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": _blob(layout, d), "size": len(d)}
        for d in layer_data
    ]
    cfg_bytes = json.dumps(cfg).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": _blob(layout, cfg_bytes),
            "size": len(cfg_bytes),
        },
        "layers": layer_descs,
    }
    man_bytes = json.dumps(manifest).encode()
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": _blob(layout, man_bytes),
                "size": len(man_bytes),
                "annotations": {"org.opencontainers.image.ref.name": tag},
            }
        ],
    }
    (layout / "index.json").write_text(json.dumps(index))
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return layout


def docker_archive(path: Path, layers=(LAYER1, LAYER2), config=CONFIG) -> Path:
    layer_data = [tar_bytes(layer) for layer in layers]
    cfg = json.loads(json.dumps(config))
    cfg["rootfs"]["diff_ids"] = ["sha256:" + hashlib.sha256(d).hexdigest() for d in layer_data]
    cfg_bytes = json.dumps(cfg).encode()
    cfg_name = hashlib.sha256(cfg_bytes).hexdigest() + ".json"
    entries = [(cfg_name, "file", cfg_bytes, 0o644)]
    names = []
    for i, d in enumerate(layer_data):
        names.append(f"layer{i}/layer.tar")
        entries += [(f"layer{i}", "dir", None, 0o755), (f"layer{i}/layer.tar", "file", d, 0o644)]
    manifest = [{"Config": cfg_name, "RepoTags": ["test:latest"], "Layers": names}]
    entries.append(("manifest.json", "file", json.dumps(manifest), 0o644))
    path.write_bytes(tar_bytes(entries))
    return path


def tree(root: Path, skip=("dev",)) -> dict:
    """A comparable description: type, mode, content, link target, hard-link group."""
    out, inodes = {}, {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            full = Path(dirpath) / name
            rel = str(full.relative_to(root))
            if rel.split("/")[0] in skip:
                continue
            st = full.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("symlink", os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", oct(stat.S_IMODE(st.st_mode)))
            else:
                group = inodes.setdefault(st.st_ino, rel)
                out[rel] = (
                    "file",
                    oct(stat.S_IMODE(st.st_mode)),
                    full.read_bytes(),
                    group if st.st_nlink > 1 else None,
                )
    return out
