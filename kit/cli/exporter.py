"""`kit exporter`: the metrics exporter (the same program as `python -m kit.monitor`)."""

from __future__ import annotations

import click


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def exporter(args):
    """Serve GPU, node and training metrics to Prometheus (see kit exporter --help)."""
    from kit.monitor.__main__ import main

    return main(list(args))
