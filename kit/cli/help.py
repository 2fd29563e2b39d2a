"""Help that reads like a map: a command's options in topic groups, each with
one line of purpose (Click lists options as one flat wall)."""

from __future__ import annotations

import click


def option_name(ctx: click.Context, option: click.Parameter) -> str | None:
    """An option's name in a group; ``help`` for the help option, whatever Click calls it
    (``help`` up to 8.4, ``_click_default_help`` from 8.5): the one option ``get_params`` adds to
    the command's own."""
    return "help" if all(option is not p for p in ctx.command.params) else option.name


class GroupedCommand(click.Command):
    """A command whose ``--help`` lists its options under ``groups``:
    (title, purpose, option names); an option no group names goes under
    "Other options" (a test keeps that group empty)."""

    def __init__(self, *args, groups: tuple[tuple[str, str, tuple[str, ...]], ...] = (), **kwargs):
        super().__init__(*args, **kwargs)
        self.groups = groups

    def grouped(self, ctx: click.Context) -> list[tuple[str, str, list[click.Parameter]]]:
        options = [p for p in self.get_params(ctx) if isinstance(p, click.Option)]
        out, seen = [], set()
        for title, purpose, names in self.groups:  # several options may share a name (--local/--site)
            out.append((title, purpose, [p for n in names for p in options if option_name(ctx, p) == n]))
            seen.update(names)
        rest = [p for p in options if option_name(ctx, p) not in seen]
        if rest:
            out.append(("Other options", "", rest))
        return out

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        for title, purpose, params in self.grouped(ctx):
            rows = [r for p in params if (r := p.get_help_record(ctx)) is not None]
            if not rows:
                continue
            with formatter.section(title):
                if purpose:
                    formatter.write_text(purpose)
                formatter.write_dl(rows)
