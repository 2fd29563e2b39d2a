"""The code a job runs: :mod:`~kit.code.snapshot` (taken at submission: a git work tree or ``--code DIR``),
:mod:`~kit.code.store` (its content-addressed store, which cannot be swapped or written through) and
:mod:`~kit.code.trim` (``kit trim``: the pinned images, snapshots and login-node trees no job needs any more)."""
