"""kit's command line: thin Click commands over the library.

:func:`main` (:mod:`~kit.cli.group`) is the one edge where errors become messages: a :class:`~kit.errors.KitError`
or a Click usage error prints ``kit: FIELD: MESSAGE`` (plus a ``hint:`` line) on stderr and exits with its code
(2 for bad usage). An OSError that reaches it (a full disk, a read-only or vanished path) is one line too, exit 1;
``kit -v`` shows its traceback. Nothing else is caught, so a bug still shows its traceback. Each command is a
module of its own (``launch``, ``jobs``, ``build``, ``cluster``, ``report``, …), imported when used.
"""

from kit.cli.group import COMMANDS, cli, main

__all__ = ["COMMANDS", "cli", "main"]
