"""`kit ui`: your jobs in the browser, served on 127.0.0.1 by kit (read-only)."""

from __future__ import annotations

import click

from kit.cli.common import output_dirs


@click.command()
@click.option("--port", type=click.IntRange(0, 65535), default=0, help="The port on 127.0.0.1 [default: a free one].")
@output_dirs("Also look for job directories here (repeatable), as kit ps does.")
def ui(port, output_dirs):
    """A read-only page of your jobs: the list kit ps shows (its filters too) and each job's page — its runs'
    timeline, every rank's progress, the report's picture and notes, the batch log's end, hang stacks — reloading
    while the job runs. Served on 127.0.0.1 only; the address printed holds this session's token (anyone else on
    a shared login node gets 403). Ctrl-C stops it."""
    from kit.ui import server

    running = server.start(server.Ui(tuple(output_dirs)), port)
    click.echo(server.address(running))
    click.echo("kit ui: open the address above (Ctrl-C stops)", err=True)
    try:
        running.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        running.server_close()
    return 0
