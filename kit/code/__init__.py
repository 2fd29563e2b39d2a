"""The code a job runs: :mod:`~kit.code.snapshot` (taken at submission: a git work tree or ``--code DIR``),
:mod:`~kit.code.store` (its content-addressed store, which cannot be swapped or written through). What no job
needs any more is the job room's to say (:mod:`kit.job.trim`)."""
