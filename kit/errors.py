"""The one error type kit's library raises for problems a user can fix."""

from __future__ import annotations


class KitError(Exception):
    """A problem the user can act on.

    ``field`` names what was wrong as the user spelled it (``--nodes``,
    ``job.toml: nodes``); ``hint`` says how to fix it. The command edge
    (:func:`kit.cli.main`) turns this into ``kit: FIELD: MESSAGE`` plus a
    ``hint:`` line and exit code ``exit_code`` (2: bad usage).
    """

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        hint: str | None = None,
        exit_code: int = 2,
        detail: str | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.field = field
        self.hint = hint
        self.exit_code = exit_code
        self.detail = detail  # e.g. the captured output of a failed command

    def with_field(self, field: str) -> "KitError":
        self.field = field
        return self

    def format(self) -> str:
        head = f"kit: {self.field}: {self.message}" if self.field else f"kit: {self.message}"
        lines = [head]
        if self.detail:
            lines.extend("  " + line for line in self.detail.rstrip().splitlines())
        if self.hint:
            lines.append(f"hint: {self.hint}")
        return "\n".join(lines)
