"""`kit convert`: an existing sbatch script as a kit job file."""

from __future__ import annotations

import os

import click

from kit.errors import KitError


@click.command()
@click.argument("script", type=click.Path(dir_okay=False))
@click.argument("sbatch_args", nargs=-1, metavar="[-- SBATCH-OPTIONS...]")
def convert(script, sbatch_args):
    """Print the kit job file equivalent to SCRIPT (an sbatch script), and what it could not carry over.
    The options its user gives sbatch on the command line (after --) count too, over its #SBATCH lines.

    \b
    kit convert train_ddp.sbatch > job.toml && kit launch -f job.toml
    kit convert prelaunch.sh -- --nodes=4 --gpus-per-node=8 --container-image=/x.sqsh > job.toml
    kit convert submit.sh > job.toml    (a file holding the sbatch line: its script, with its options)
    """
    from kit import files
    from kit.core.text import printable
    from kit.image.info import image_has
    from kit.slurm.convert import convert as convert_script

    def read(path: str) -> str:
        return files.read_bytes(path, 1 << 20, follow=True).decode("utf-8", errors="replace")

    try:
        text = read(script)
    except FileNotFoundError:
        raise KitError(f"no such script: {script}", field="SCRIPT") from None
    except OSError as e:
        raise KitError(f"cannot read {script}: {e.strerror}", field="SCRIPT") from None
    result = convert_script(text, sbatch_args, inspect=image_has, cwd=os.getcwd(), read=read)
    click.echo(result.toml(script), nl=False)
    for item in result.changed:
        click.echo(f"kit: changed: {printable(item)}", err=True)
    for item in result.not_carried:
        click.echo(f"kit: not carried over: {printable(item)}", err=True)
    return 0
