"""kit's command line: the group of commands (each imported when used) and :func:`main`, the one edge where errors become messages and where a login node's command goes there (``--host``)."""

from __future__ import annotations

import importlib
import os
import socket
import sys
from pathlib import Path

import click

from kit import runner
from kit.cli.common import SERVING
from kit.errors import KitError
from kit.remote import wire
from kit.version import __version__


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


COMMANDS = {
    "launch": "kit.cli.launch:launch",
    "ps": "kit.cli.jobs:ps",
    "logs": "kit.cli.jobs:logs",
    "cancel": "kit.cli.jobs:cancel",
    "rerun": "kit.cli.jobs:rerun",
    "events": "kit.cli.jobs:events",
    "ui": "kit.cli.ui:ui",
    "build": "kit.cli.build:build",
    "inspect": "kit.cli.build:inspect",
    "cluster": "kit.cli.cluster:cluster",
    "exporter": "kit.cli.exporter:exporter",
    "report": "kit.cli.report:report",
    "convert": "kit.cli.convert:convert",
    "trim": "kit.cli.trim:trim",
    "check": "kit.cli.check:check",
    **wire.SERVER_COMMANDS,
}


@click.group(name="kit", cls=_LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kit")
@click.option("-v", "--verbose", is_flag=True, help="Log every external command kit runs.")
@click.option(
    "--host",
    metavar="LOGIN",
    help="Run the command on this login node, through ssh [$KIT_HOST]: "
    "launch, ps, logs, cancel, report, rerun, trim, cluster status.",
)
def cli(verbose: bool, host: str | None) -> None:
    """Launch multi-node PyTorch Lightning jobs on Slurm.

    \b
    Start a local cluster and run a 2-node job on it:
      kit cluster up --nodes 2
      kit launch --local --nodes 2 --wait -- python -m kit.train --max-steps 50
    """
    runner.VERBOSE = verbose
    if host is not None:  # main() sends the login node's commands there before Click sees them: this is the laptop's
        command = click.get_current_context().invoked_subcommand
        raise KitError(
            f"kit {command} runs here, not on the login node",
            field="--host",
            hint=f"run it without --host (over SSH: {', '.join(wire.COMMANDS)}; `cluster status`)",
        )


def _on_the_login_node(args: list[str]) -> tuple[str, list[str]] | None:
    """(host, the command's arguments) when ``args`` ask for a command the login node runs: ``--host`` among
    kit's own options, or ``KIT_HOST`` set; None otherwise."""
    host, rest, i = None, [], 0
    while i < len(args) and args[i].startswith("-"):
        if args[i] == "--host" and i + 1 < len(args):
            host, i = args[i + 1], i + 2
        elif args[i].startswith("--host="):
            host, i = args[i].split("=", 1)[1], i + 1
        else:
            rest.append(args[i])
            i += 1
    command = args[i : i + 2]
    runs_there = (
        bool(command) and command[0] in wire.COMMANDS and (command[0] != "cluster" or command[1:] == ["status"])
    )
    if any(a in ("-h", "--help", "--version") for a in rest) or not runs_there:
        return None  # help and version are the laptop's; a laptop command with --host is refused by cli()
    if host is None:  # an empty --host is a mistake (Host.of refuses it), never "run here"
        host = os.environ.get("KIT_HOST") or None
    return (host, rest + args[i:]) if host is not None else None


def _usage_error(e: click.UsageError) -> KitError:
    field = None
    message = e.format_message()
    param = getattr(e, "param", None)
    if param is not None and isinstance(e, click.BadParameter):
        field = param.opts[0] if getattr(param, "opts", None) else param.name
        message = e.message
    ctx = e.ctx
    command = ctx.command_path if ctx else "kit"
    return KitError(message.rstrip("."), field=field, hint=f"see `{command} --help`")


def _follows(args: list[str]) -> bool:
    """``kit logs -f``: a command whose output goes on (ridden through a dropped connection)."""
    words = [a for a in args if not a.startswith("--host")]
    return "logs" in words and any(a in ("-f", "--follow") for a in words)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if any("\x00" in a for a in args):  # only possible in-process; no path or value may hold one
        click.echo("kit: an argument contains a NUL byte", err=True)
        sys.exit(2)
    refused = wire.refuse_other_version()
    if refused is not None:  # this kit runs on a login node for a client of another version
        click.echo(refused.format(), err=True)
        sys.exit(refused.exit_code)
    try:
        serving = os.environ.pop(wire.VERSION_VARIABLE, None) is not None  # on a login node, for a client
        if serving:
            SERVING["login node"] = socket.gethostname()
            wire.hello()  # what the login shell printed before this is skipped by the laptop
            wire.as_the_login_node()
            args = wire.read_args() if args == [wire.ARGS_COMMAND] else args
            if not set(wire.READS_INPUT) & set(args[:2]):
                wire.watch_input_end()  # (remote-launch and remote-submit read their input first, then watch it)
        # A client's command runs here, never on to another host: a KIT_HOST of the login node's own
        # environment (dotfiles shared with the laptop) would otherwise have it call itself again and again.
        there = None if serving else _on_the_login_node(args)
        if there is not None:
            from kit.remote import client, ssh  # (a local command loads no ssh machinery)

            host, rest = there
            command = [a for a in rest if not a.startswith("-")][:1]
            if command == ["launch"]:
                from kit.cli.launch import request_of
                from kit.remote import transfer

                request = request_of(rest[rest.index("launch") + 1 :])  # read here: a usage error is this side's
                sys.exit(transfer.launch(ssh.Host.of(host), request, Path.cwd()))
            if command == ["report"] and any(a in ("-o", "--output") or a.startswith("--output=") for a in rest):
                from kit.cli.report import report_here  # the picture comes here

                sys.exit(report_here(ssh.Host.of(host), rest[rest.index("report") + 1 :]))
            if command == ["ui"]:
                from kit.remote import tunnel  # the pages come here, through the master connection

                sys.exit(tunnel.ui(ssh.Host.of(host), rest))
            sys.exit(client.run(ssh.Host.of(host), rest, follow=_follows(rest)))
        rv = cli.main(args=args, prog_name="kit", standalone_mode=False)
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
    except BrokenPipeError:  # whoever read kit's output left (`kit --host … logs | head -1`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nor at the interpreter's exit
        sys.exit(1)  # as Click exits for a command's own output
    except OSError as e:
        if runner.VERBOSE:
            raise
        where = e.filename if e.filename is not None else "system"
        click.echo(f"kit: {where}: {e.strerror or e}", err=True)
        click.echo("hint: run `kit -v ...` to see where it happened", err=True)
        sys.exit(1)
    sys.exit(rv if isinstance(rv, int) else 0)
