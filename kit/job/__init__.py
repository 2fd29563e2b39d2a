"""kit's jobs, here: the local bodies below the one face (:mod:`kit.api`). :mod:`~kit.job.handle` (the launch,
the job handle's methods, ``kit.jobs``' and ``kit.rerun``'s bodies), :mod:`~kit.job.functions` (function jobs:
``kit.submit``, ``kit.map``), :mod:`~kit.job.hosting` (which methods a job on a login node calls there, and how
their values travel: one registry for both sides; :mod:`~kit.job.sides` where one value is not enough),
:mod:`~kit.job.listing` (the jobs a user has: ``kit ps``'s rows), :mod:`~kit.job.logs` (a job's logs as ``kit
logs`` reads them) and :mod:`~kit.job.trim` (``kit trim``: the pinned images, snapshots and login-node trees no
job needs any more). Nothing here knows a transport: the face hands a job on a login node its own."""
