"""kit's local Slurm cluster: one slurmctld and N slurmd daemons on this machine.

Debian's slurm-wlm runs several slurmd on one host with ``slurmd -N NAME``:
each NodeName (node1, node2, ...) gets NodeHostname = this host and a port of
its own. GPUs are count-only GRES, so ``--gpus-per-node`` requests schedule.
Everything lives under ``$KIT_HOME/cluster`` but what its clients read (``public``); ``up`` is idempotent
and repairs stale state, ``down`` stops exactly the daemons ``up`` started (by pid).
Its face (:class:`LocalCluster`, :mod:`~kit.cluster.local`) runs the daemons (:mod:`~kit.cluster.daemons`); beside it: ``config`` (their files), ``state``,
``processes`` (/proc), ``prometheus``, ``plugin`` (pyxis or the stand-in), ``accounting`` (MariaDB
and slurmdbd), ``teardown`` (``down``'s steps).
"""

from kit.cluster.local import INSTALL_HINT, REQUIRED, LocalCluster

__all__ = ["INSTALL_HINT", "LocalCluster", "REQUIRED"]
