"""``kit --host LOGIN launch …`` from a laptop: the job's code travels as its content-addressed objects.

The laptop takes the code snapshot as a local launch would (the git work tree, or ``--code DIR``) into its
own store, and opens one connection (:mod:`kit.remote.client`) to ``kit remote-launch`` on the login node, which
speaks a short protocol on its standard input and output before it launches. The launch itself crosses as
one :class:`kit.core.jobfile.Request` (the job file's dictionary, JSON, in the arguments): the laptop reads its
command line (or ``kit.launch``'s keywords) into it, and the login node launches it as a local launch does.

1. laptop → login: one JSON line: the snapshot's digest and its manifest (paths, modes, objects);
2. login → laptop: one JSON line: the objects its store (``$KIT_HOME/code``) lacks;
3. laptop → login: each of those, a JSON line (name, size) and its bytes; the login node keeps an object
   only when its content hashes to its name, and a manifest only when it hashes to the digest;
4. the login node lays the snapshot out as a tree of its own (``$KIT_HOME/trees/<tree>/<manifest>``, links
   to its store's objects, read-only; one per content, so two launches never share a half-made one; the
   last three kept), and launches from the directory that stands for the laptop's, with the
   snapshot as the laptop took it (its git commit and dirtiness in ``job.json``; not taken again there):
   relative paths (a job file, a script) mean what they meant on the laptop. Its output comes back as it
   comes.

An unchanged tree sends no object; a one-file edit sends that file. Paths the job names by absolute path
(``--image``, ``--mount``) and ``--output-dir`` are the login node's (a relative ``--output-dir`` is
under the login home; without one, ``~/kit-jobs``). Nothing of the laptop's environment crosses but the
request, which travels inside the SSH channel as every ``--host`` call's arguments do (:func:`kit.remote.client.start`:
never on the login node's command line; a ``--env NAME=VALUE`` lands 0700 in the job directory as on a
local launch).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import secrets
import shutil
import socket
import sys
from pathlib import Path

from kit import files
from kit.code import snapshot as snapshots
from kit.code import store as codestore
from kit.core import jobfile
from kit.core.text import Shown
from kit.errors import KitError
from kit.home import kit_home
from kit.image import is_reference, pin
from kit.remote import client, ssh, wire

LINE_LIMIT = 1 << 30  # a manifest of 200,000 paths fits
KEEP_TREES = 3
CHUNK = 1 << 20


# ---------------------------------------------------------------- the laptop's side
def launch(host: ssh.Host, request: jobfile.Request, cwd: Path) -> int:
    """`kit launch` on the login node, with the code of ``cwd`` (or ``code``) sent first."""
    code, job, said, options = _launched(host, request, cwd, say=lambda line: print(line, file=sys.stderr, flush=True))
    if code == 255 and job and job.get("job_id") and request.wait:  # the job is in: only the connection went
        return ride_through(host, str(job["job_id"]), str(job["job_dir"]))
    return ssh.checked(host, code, said, options)


def launch_call(host: ssh.Host, request: jobfile.Request, cwd: Path) -> tuple[dict, list[str]]:
    """``kit.launch(..., host=)``: the launch there as :func:`launch` makes it; (the job it answered, the lines
    it and the code's transfer said). A failure there is its ``kit: …`` line as a :class:`KitError`."""
    said_here: list[str] = []
    code, job, said, options = _launched(
        host, dataclasses.replace(request, as_json=True, wait=False), cwd, say=said_here.append, echo=False
    )
    ssh.checked(host, code, said, options)
    if code != 0:
        raise ssh.failure(host, code, said)
    if not isinstance(job, dict) or "job_dir" not in job:
        raise KitError(f"kit launch on {host.name} answered no job", field="host", exit_code=1)
    return job, [*said_here, *(line[5:].strip() for line in said.splitlines() if line.startswith("kit: "))]


def _launched(host: ssh.Host, request: jobfile.Request, cwd: Path, say, echo: bool = True):
    """The launch there (``kit remote-launch``: ``request`` as JSON), its code sent first (unless
    ``code_snapshot`` is off); (ssh's exit code, the job it answered (None when none came), what it said on
    stderr, the connection's options). ``echo``: its output and its stderr shown here as they come."""
    options = ssh.connection_options(host)
    write = wire.Records(Shown() if echo else (lambda data: None))
    sent_request = dataclasses.replace(request, fields={k: v for k, v in request.fields.items() if k != "code"})

    def job():
        return next((r["launched"] for r in write.seen if isinstance(r.get("launched"), dict)), None)

    if request.fields.get("code_snapshot") is False:
        proc = client.start(host, ["remote-launch", "--job", sent_request.to_json()], options)
        tail = client.forward_stderr(proc, echo)
        code = client.pass_through(proc, write=write)
        return code, job(), tail.join(), options
    snap = snapshots.take(cwd, request.fields.get("code"), store=snapshots.store_for(kit_home()))
    if snap is None:
        raise KitError(
            f"{cwd} is in no git work tree: over SSH the job's code must travel",
            field="--host",
            hint="launch from your repository, or give --code DIR (--no-code-snapshot: run what is on the login node)",
        )
    root = Path(snap.root)
    where = str(Path(cwd).resolve().relative_to(root)) if codestore.inside(Path(cwd).resolve(), root) else "."
    tree = (
        f"{files.safe_name(root.name, 40) or 'tree'}-"
        f"{hashlib.sha256(f'{socket.gethostname()}:{root}'.encode()).hexdigest()[:12]}"
    )
    with codestore.opened(Path(snap.store), create=False) as (_, objects, manifests):
        about, manifest, sources = outgoing(snap, objects, manifests)
        image = _laptop_image(request.fields.get("image"), Path(cwd))
        if image is not None:  # sent as the login node's pinned copy, by content, unless it is there
            about["image"], sources[f"image:sha256-{image[1].partition(':')[2]}.sqsh"] = image[1], image[0]
        proc = client.start(
            host, ["remote-launch", "--tree", tree, "--cwd", where, "--job", sent_request.to_json()], options
        )
        tail = client.forward_stderr(proc, echo)
        try:
            sent = _send(proc, about, manifest, sources)
            if sent is not None:
                say(f"kit: code {snap.digest[:19]}: sent {sent[0]} object(s), {snapshots.mib(sent[1])}, to {host.name}")
                if image is not None:
                    say(
                        f"kit: image {image[1][:19]}: "
                        + (f"sent {snapshots.mib(sent[2])}" if sent[2] is not None else "already there")
                    )
            code = client.pass_through(proc, write=write)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return code, job(), tail.join(), options


def object_names(entries) -> list[str]:
    """The store's object names a snapshot's manifest entries use (an executable's with ``.x``)."""
    return sorted({v + (".x" if k == "x" else "") for _, k, v in entries if k in ("f", "x")})


def outgoing(snap, objects: Path, manifests: Path) -> tuple[dict, bytes, dict[str, Path]]:
    """What a snapshot sends (:func:`_send`): its header's values, its manifest, its objects by name."""
    manifest = files.read_bytes(manifests / (snap.digest.split(":")[1] + ".json"), LINE_LIMIT)
    sources = {name: objects / name for name in object_names(codestore.entries(snap, manifests))}
    return {k: getattr(snap, k) for k in ("digest", "source", "files", "bytes", "commit", "dirty")}, manifest, sources


def ride_through(host: ssh.Host, job_id: str, job_dir: str) -> int:
    """``--wait`` after its connection dropped: connect again (for up to :data:`kit.remote.client.RIDE_THROUGH`
    seconds) and wait for the job there (``kit remote-wait``); the job's exit code, as ``--wait`` gives it."""
    print(f"kit: job {job_id}: the connection to {host.name} dropped; waiting again", file=sys.stderr, flush=True)
    return client.riding_through(lambda: client.run(host, ["remote-wait", job_dir, "--job-id", job_id]))


def _laptop_image(given: str | None, cwd: Path) -> tuple[Path, str] | None:
    """``--image FILE`` when FILE is on the laptop: (its path, ``sha256:<hex>``, from the stat memo when
    unchanged); None for a registry reference or a path only the login node has."""
    if not given or is_reference(given):
        return None
    path = (cwd / Path(given).expanduser()).absolute()
    return (path, pin.pin(path, copy=False)[1]) if path.is_file() else None


def _send(proc, about: dict, manifest: bytes, sources: dict[str, Path]) -> tuple[int, int, int | None] | None:
    """Steps 1-3: (code objects, their bytes, the image's bytes or None) sent, or None when the login node
    said no before asking (its error is on stderr)."""
    try:
        proc.stdin.write(
            json.dumps({**about, "manifest": manifest.decode("utf-8", "surrogateescape")}, ensure_ascii=True).encode()
            + b"\n"
        )
        proc.stdin.flush()
        missing = wire.read(proc.stdout)["missing"]
    except (OSError, wire.NoRecord, KeyError):
        with contextlib.suppress(OSError):
            proc.stdin.close()  # kit there, if it waits for objects, ends (its error is on stderr)
        return None
    if not isinstance(missing, list):
        return None
    count = size = 0
    image = None
    for name in missing:
        if name not in sources:
            raise KitError(
                f"the login node asked for {name!r}, which is not this launch's", field="--host", exit_code=1
            )
        with files.open_regular(sources[name], follow=name.startswith("image:")) as (fd, st):
            proc.stdin.write(json.dumps({"name": name, "size": st.st_size}).encode() + b"\n")
            while chunk := os.read(fd, CHUNK):
                proc.stdin.write(chunk)
        if name.startswith("image:"):
            image = st.st_size
        else:
            count, size = count + 1, size + st.st_size
    proc.stdin.flush()
    return count, size, image


# ---------------------------------------------------------------- the login node's side
def receive(tree: str, where: str) -> tuple[codestore.Snapshot, Path, Path | None]:
    """Steps 1-4 on the login node: the snapshot's objects and manifest into ``$KIT_HOME/code``, its tree
    laid out, the laptop's image (if any) pinned; (the snapshot, as the laptop took it, rooted at the tree;
    the directory in the tree that stands for the laptop's: ``where``; the image's pinned copy)."""
    if not tree or "/" in tree or tree.startswith(".") or Path(where).is_absolute() or ".." in Path(where).parts:
        raise KitError(f"not a tree name or place: {tree!r}, {where!r}", field="remote-launch")
    try:
        header = json.loads(sys.stdin.buffer.readline(LINE_LIMIT))
        digest, manifest = header["digest"], header["manifest"].encode("utf-8", "surrogateescape")
        about = (
            str(header["source"]),
            int(header["files"]),
            int(header["bytes"]),
            header["commit"] if isinstance(header["commit"], str) else None,
            header["dirty"] if isinstance(header["dirty"], bool) else None,
        )
        image_hex = _hex(header["image"]) if header.get("image") is not None else None
        image = f"sha256-{image_hex}.sqsh" if image_hex is not None else None
    except (ValueError, KeyError, AttributeError, TypeError):
        raise KitError("the laptop sent no snapshot", field="remote-launch") from None
    hexdigest = digest.partition(":")[2] if isinstance(digest, str) else ""
    if hashlib.sha256(manifest).hexdigest() != hexdigest:
        raise KitError("the snapshot's manifest does not hash to its name", field="remote-launch")
    store = kit_home() / "code"
    with codestore.opened(store, create=True) as (_, objects, manifests):
        path = manifests / f"{hexdigest}.json"
        if not files.verify(path, hexdigest):
            files.write_atomic(path, manifest, 0o600)
        snap = codestore.Snapshot(digest, str(store), str(store), "directory", 0, 0)
        entries = codestore.entries(snap, manifests)
        names = object_names(entries)
        # What is there is used only when it holds what its name says (checked, or the very file checked
        # before: the memo): a damaged object or image is asked for again, not used nor kept forever.
        memo = files.StatMemo(store / "received-memo.json")
        memo.keep_only([*names, f"image:{image}"])  # this launch's alone
        missing = [n for n in names if not files.verify(objects / n, n.removesuffix(".x"), memo, key=n)]
        damaged = [n for n in missing if os.path.lexists(objects / n)]
        images = pin.pins()
        if image is not None and not files.verify(images / image, image_hex, memo, key=f"image:{image}"):
            missing.append(f"image:{image}")
        memo.save()
        wire.write({"missing": missing})
        for _ in missing:
            _receive_object(objects, images, set(missing))
        trees = kit_home() / "trees" / tree
        if damaged:  # its files are links to the damaged objects: laid out again from the whole ones
            files.remove_tree(trees / hexdigest[:16])
        top = _lay_out(trees, hexdigest[:16], entries, objects)
    return (
        codestore.Snapshot(digest, str(top), str(store), *about),
        top / where,
        images / image if image is not None else None,
    )


def _hex(digest) -> str:
    hexdigest = digest.partition(":")[2] if isinstance(digest, str) and digest.startswith("sha256:") else ""
    if len(hexdigest) != 64 or not codestore.HEX.issuperset(hexdigest):
        raise ValueError(f"not a digest: {digest!r}")
    return hexdigest


def _receive_object(objects: Path, images: Path, expected: set[str]) -> None:
    """One object (or ``image:`` the image) from the laptop, kept only when it hashes to its name."""
    try:
        head = json.loads(sys.stdin.buffer.readline(4096))
        name, size = head["name"], int(head["size"])
    except (ValueError, KeyError, TypeError):
        raise KitError("the laptop's objects stopped short", field="remote-launch") from None
    if name not in expected or size < 0:
        raise KitError(f"an object that was not asked for: {name!r}", field="remote-launch")
    into, final = (images, name.removeprefix("image:")) if name.startswith("image:") else (objects, name)
    if into is images:
        images.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = into / f".in-{secrets.token_hex(8)}"
    h = hashlib.sha256()
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "wb") as w:
        left = size
        while left:
            chunk = sys.stdin.buffer.read(min(left, CHUNK))
            if not chunk:
                break
            h.update(chunk)
            w.write(chunk)
            left -= len(chunk)
    if left or h.hexdigest() != final.removesuffix(".x").removeprefix("sha256-").removesuffix(".sqsh"):
        os.unlink(tmp)
        raise KitError(
            f"the object {final[:19]} did not arrive whole, or is not what its name says", field="remote-launch"
        )
    os.chmod(tmp, 0o555 if final.endswith(".x") else 0o444)
    os.rename(tmp, into / final)


def _lay_out(trees: Path, name: str, entries, objects: Path) -> Path:
    """The snapshot as a directory (``trees/<name>``), made once per content: links to the store's objects
    (a copy where a link cannot be made), the snapshot's symlinks; the oldest beyond :data:`KEEP_TREES` go."""
    top = trees / name
    if not top.is_dir():
        trees.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = trees / f".{name}-{secrets.token_hex(4)}"
        tmp.mkdir(mode=0o755)
        for rel, kind, value in entries:
            dest = tmp / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            if kind == "l":
                os.symlink(value, dest)
            elif kind in ("f", "x"):
                source = objects / (value + (".x" if kind == "x" else ""))
                try:
                    os.link(source, dest, follow_symlinks=False)
                except OSError:
                    shutil.copy2(source, dest, follow_symlinks=False)
        try:
            os.rename(tmp, top)
        except OSError:  # another launch of the same content made it first
            files.remove_tree(tmp)
    os.utime(top)
    old = sorted(
        (p for p in trees.iterdir() if p.is_dir() and not p.name.startswith(".")), key=lambda p: p.stat().st_mtime
    )[:-KEEP_TREES]
    for p in old:
        files.remove_tree(p)
    return top


def on_the_login_node(request: jobfile.Request, image: Path | None = None) -> jobfile.Request:
    """The launch as the login node runs it: its output directory the login node's (relative: under the login
    home; none given: ``~/kit-jobs``); the laptop's image, its pinned copy here."""
    from kit.remote.server import under_home

    output = under_home(request.fields.get("output_dir"))
    return request.with_fields(output_dir=output, **({"image": str(image)} if image is not None else {}))
