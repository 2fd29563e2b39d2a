"""kit's command line: thin Click commands over the library.

:func:`main` is the one edge where errors become messages: a
:class:`~kit.errors.KitError` or a Click usage error prints ``kit: FIELD:
MESSAGE`` (plus a ``hint:`` line) on stderr and exits with its code (2 for
bad usage). An OSError that reaches it (a full disk, a read-only or vanished
path) is one line too, exit 1; ``kit -v`` shows its traceback. Nothing else is
caught, so a bug still shows its traceback.
"""

from __future__ import annotations

import importlib
import logging
import sys

import click

from kit.version import __version__
from kit.errors import KitError


class _LazyGroup(click.Group):
    """A group whose subcommands are imported when used: `kit build` and `kit ps` do
    not load the Slurm, launch and cluster code (every kit call, and every helper a
    job runs, pays Python's import time)."""

    def __init__(self, *args, lazy: dict[str, str], **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy = lazy  # name -> "module:attribute"

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.commands and name in self.lazy:
            module, attribute = self.lazy[name].split(":")
            self.add_command(getattr(importlib.import_module(module), attribute), name)
        return super().get_command(ctx, name)


COMMANDS = {"launch": "kit.cli.launch:launch", "ps": "kit.cli.jobs:ps", "logs": "kit.cli.jobs:logs",
            "cancel": "kit.cli.jobs:cancel", "rerun": "kit.cli.jobs:rerun", "build": "kit.cli.build:build", "inspect": "kit.cli.build:inspect",
            "cluster": "kit.cli.cluster:cluster", "exporter": "kit.cli.exporter:exporter",
            "report": "kit.cli.report:report", "convert": "kit.cli.convert:convert", "trim": "kit.cli.trim:trim"}


@click.group(name="kit", cls=_LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kit")
@click.option("-v", "--verbose", is_flag=True, help="Log every external command kit runs.")
def cli(verbose: bool) -> None:
    """Launch multi-node PyTorch Lightning jobs on Slurm.

    \b
    Start a local cluster and run a 2-node job on it:
      kit cluster up --nodes 2
      kit launch --local --nodes 2 --wait -- python -m kit.train --max-steps 50
    """
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                        format="kit: %(name)s: %(message)s")


def _usage_error(e: click.UsageError) -> KitError:
    field = None
    message = e.format_message()
    param = getattr(e, "param", None)
    if param is not None and isinstance(e, click.BadParameter):
        field = (param.opts[0] if getattr(param, "opts", None) else param.name)
        message = e.message
    ctx = e.ctx
    command = ctx.command_path if ctx else "kit"
    return KitError(message.rstrip("."), field=field, hint=f"see `{command} --help`")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if any("\x00" in a for a in args):  # only possible in-process; no path or value may hold one
        click.echo("kit: an argument contains a NUL byte", err=True)
        sys.exit(2)
    try:
        rv = cli.main(args=argv, prog_name="kit", standalone_mode=False)
    except KitError as e:
        click.echo(e.format(), err=True)
        sys.exit(e.exit_code)
    except click.UsageError as e:
        click.echo(_usage_error(e).format(), err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("kit: aborted", err=True)
        sys.exit(130)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except OSError as e:
        if logging.getLogger().isEnabledFor(logging.DEBUG):
            raise
        where = e.filename if e.filename is not None else "system"
        click.echo(f"kit: {where}: {e.strerror or e}", err=True)
        click.echo("hint: run `kit -v ...` to see where it happened", err=True)
        sys.exit(1)
    sys.exit(rv if isinstance(rv, int) else 0)
