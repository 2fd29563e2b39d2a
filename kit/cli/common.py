"""Options several commands share, declared once."""

from __future__ import annotations

import click

from kit.core.options import OUTPUT_DIR

# One job looked up by id (kit logs, cancel, rerun, events, report).
OUTPUT_DIR_LOOKUP = click.option(
    "--output-dir", default=OUTPUT_DIR, show_default=True, help="Where to look up a job id."
)


def output_dirs(help_text: str):
    """``--output-dir`` (repeatable) as ``output_dirs``: where kit ps, kit ui and kit trim look for jobs."""
    return click.option(
        "--output-dir", "output_dirs", multiple=True, default=(OUTPUT_DIR,), show_default=True, help=help_text
    )


# Set by kit's entry point when this kit answers a laptop's `kit --host` through ssh (kit.remote.wire's hello): a
# command then says that the paths it prints are this login node's.
SERVING: dict = {"login node": None}
