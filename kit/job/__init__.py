"""kit's jobs from Python: :mod:`~kit.job.api` (``kit.launch``, ``kit.Job``, ``kit.jobs``, ``kit.rerun``),
:mod:`~kit.job.functions` (``kit.submit``, ``kit.map``, ``kit.FunctionJob``), :mod:`~kit.job.listing` (the jobs a
user has: ``kit ps``'s rows) and :mod:`~kit.job.logs` (a job's logs as ``kit logs`` reads them). ``import kit``
loads them on first use (see :mod:`kit`)."""
