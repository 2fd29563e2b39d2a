"""`kit build` and `kit inspect`: squashfs images for enroot and pyxis."""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict
from pathlib import Path

import click

from kit.image import recipe as recipes  # light: the build library is imported by the commands


def load_recipe(
    recipe: str,
    dockerfile: str | None,
    build_args: tuple[str, ...],
    target: str | None,
    base: str | None,
    base_roots: tuple[str, ...] = (),
):
    """A TOML recipe, or a Dockerfile (RECIPE a Dockerfile, or a directory holding one)."""
    from kit.errors import KitError

    path = Path(recipe)
    if path.suffix == ".toml" and dockerfile is None:
        for flag, given in (("--build-arg", build_args), ("--target", target), ("--base-root", base_roots)):
            if given:
                raise KitError(f"{flag} is for Dockerfiles; {recipe} is a TOML recipe", field=flag)
        return recipes.load(recipe, base_override=base)
    from kit.image import dockerfile as dockerfiles

    if dockerfile is not None:
        path = Path(dockerfile) if Path(dockerfile).is_absolute() or not path.is_dir() else path / dockerfile
    elif path.is_dir():
        path = path / "Dockerfile"
    if base:
        raise KitError("--base is for TOML recipes: write the base in the Dockerfile's FROM", field="--base")
    args = {}
    for item in build_args:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise KitError(f"expected KEY=VALUE, got {item!r}", field="--build-arg")
        args[key] = value
    for root in base_roots:
        if not Path(root).is_dir():
            raise KitError(f"not a directory: {root}", field="--base-root")
    return dockerfiles.load(
        path,
        build_args=args,
        target=target,
        base_roots=tuple(Path(r) for r in base_roots),
        notice=lambda msg: click.echo(f"kit: build: {msg}", err=True),
    )


def _size(text: str) -> int:
    from kit.errors import KitError

    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)i?B?", text.strip(), re.I)
    if not m:
        raise KitError(f"expected a size like 20G or 500M, got {text!r}", field="--cache-size")
    return int(float(m.group(1)) * 1024 ** " KMGT".index((m.group(2) or " ").upper()))


def _contain() -> None:
    """A build's mounts and processes end with it: its own mount namespace, every command
    it starts killed with it, and TERM (a `timeout`, a cancelled CI job) unwinding like Ctrl-C."""
    import signal

    from kit import runner
    from kit.errors import KitError
    from kit.image import builder as lib

    lib.private_mounts()
    runner.tie_children()

    def stop(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the unwinding is under way
        raise KitError(
            "stopped by SIGTERM; the build's work directory and mounts are removed", field="build", exit_code=143
        )

    signal.signal(signal.SIGTERM, stop)


@click.command()
@click.argument("recipe", type=click.Path(), required=False)
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Where the .sqsh goes.")
@click.option(
    "-f",
    "--file",
    "dockerfile",
    default=None,
    metavar="DOCKERFILE",
    help="The Dockerfile, when RECIPE is its build context directory [default: DIR/Dockerfile].",
)
@click.option(
    "--build-arg", "build_args", multiple=True, metavar="KEY=VALUE", help="A Dockerfile ARG value (repeatable)."
)
@click.option("--target", default=None, metavar="STAGE", help="Build this Dockerfile stage [default: the last].")
@click.option(
    "--base-root",
    "base_roots",
    multiple=True,
    metavar="DIR",
    help="A directory outside the build context that a Dockerfile's FROM rootfs:/tarball:/... may name "
    "(repeatable) [default: the context only].",
)
@click.option(
    "--compression",
    default=recipes.DEFAULT_COMPRESSION,
    show_default=True,
    type=click.Choice(sorted(recipes.COMPRESSION)),
    help="lz4: 128 KiB blocks, read twice as fast through FUSE as zstd (pyxis's squashfuse mode), "
    "unpacks as fast as enroot's; zstd-fast: zstd level 3, 1 MiB blocks, 35 % smaller; enroot: -comp "
    "lzo -noD, exactly as `enroot import` (bench/bench_pack.py measures each).",
)
@click.option(
    "--base",
    "base",
    default=None,
    metavar="KIND=PATH",
    help="Use this base instead of the recipe's (KIND: " + ", ".join(recipes.BASE_KINDS) + ").",
)
@click.option("--no-cache", is_flag=True, help="Build every step again, even when the cache has it.")
@click.option(
    "--prune",
    is_flag=True,
    help="Shrink the build cache (layers and images, least recently used "
    "first) to --cache-size, after the build if there is one.",
)
@click.option("--cache-size", default="20G", show_default=True, metavar="SIZE", help="The size --prune keeps.")
def build(recipe, output, dockerfile, build_args, target, base_roots, compression, base, no_cache, prune, cache_size):
    """Build RECIPE into a squashfs image: a TOML recipe (containers/*.toml), a
    Dockerfile, or a directory holding a Dockerfile (its build context)."""
    from kit.errors import KitError
    from kit.image import builder as lib
    from kit.image import layers

    limit = _size(cache_size)
    if recipe is None:
        if not prune:
            raise KitError("missing RECIPE", field="RECIPE", hint="kit build RECIPE -o IMAGE, or kit build --prune")
        removed, freed = layers.prune(limit)
        click.echo(f"kit: build: removed {removed} cache entries ({freed / 2**20:.1f} MiB)", err=True)
        return
    if output is None:
        raise KitError("missing -o/--output", field="--output", hint="kit build RECIPE -o IMAGE.sqsh")
    r = load_recipe(recipe, dockerfile, build_args, target, base, base_roots)
    _contain()
    t0 = time.monotonic()
    result = lib.build(
        r,
        Path(output),
        compression=compression,
        use_cache=not no_cache,
        progress=lambda msg: click.echo(f"kit: build: {msg}", err=True),
    )
    took = time.monotonic() - t0
    what = {"built": "built", "up to date": "up to date", "cache": "from cache"}[result.source]
    click.echo(f"{result.image}: {what} in {took:.1f} s (digest {result.digest[:16]})")
    if prune:
        removed, freed = layers.prune(limit)
        click.echo(f"kit: build: removed {removed} cache entries ({freed / 2**20:.1f} MiB)", err=True)


@click.command()
@click.argument("image", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the details as JSON.")
def inspect(image, as_json):
    """Show an image's size, compression, environment, workdir, entrypoint and provenance."""
    from kit.image import info as image_info

    info = image_info.inspect(Path(image))
    if as_json:
        d = asdict(info)
        d["path"] = str(info.path)
        click.echo(json.dumps(d, indent=2))
        return
    click.echo(f"image:       {info.path}")
    click.echo(f"size:        {info.size / 2**20:.1f} MiB ({info.size} bytes)")
    click.echo(f"compression: {info.compression}")
    click.echo(f"workdir:     {info.workdir or '/'}")
    click.echo(f"entrypoint:  {json.dumps(info.entrypoint)}  cmd: {json.dumps(info.cmd)}")
    click.echo(f"recipe digest: {info.digest or '(not built by kit)'}")
    click.echo(f"kit runtime: {info.kit_runtime or '(none)'}")
    click.echo("environment:")
    for item in info.env:
        click.echo(f"  {item}")
