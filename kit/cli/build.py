"""`kit build` and `kit inspect`: squashfs images for enroot and pyxis."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import click

from kit.build import recipe as recipes  # light: the build library is imported by the commands


@click.command()
@click.argument("recipe", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="Where the .sqsh goes.")
@click.option("--compression", default=recipes.DEFAULT_COMPRESSION, show_default=True,
              type=click.Choice(sorted(recipes.COMPRESSION)),
              help="zstd-fast: zstd level 3, 1 MiB blocks (smaller and faster to pack than enroot's, unpacks as "
                   "fast: bench/bench_pack.py); enroot: -comp lzo -noD, exactly as `enroot import`.")
@click.option("--base", "base", default=None, metavar="KIND=PATH",
              help="Use this base instead of the recipe's (KIND: " + ", ".join(recipes.BASE_KINDS) + ").")
@click.option("--no-cache", is_flag=True, help="Build even when the cache has this image.")
def build(recipe, output, compression, base, no_cache):
    """Build RECIPE (a TOML file under containers/) into a squashfs image."""
    from kit.build import image as lib

    r = recipes.load(recipe, base_override=base)
    t0 = time.monotonic()
    result = lib.build(r, Path(output), compression=compression, use_cache=not no_cache,
                       progress=lambda msg: click.echo(f"kit: build: {msg}", err=True))
    took = time.monotonic() - t0
    what = {"built": "built", "up to date": "up to date", "cache": "from cache"}[result.source]
    click.echo(f"{result.image}: {what} in {took:.1f} s (digest {result.digest[:16]})")


@click.command()
@click.argument("image", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the details as JSON.")
def inspect(image, as_json):
    """Show an image's size, compression, environment, workdir, entrypoint and provenance."""
    from kit.build import image as lib

    info = lib.inspect(Path(image))
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
