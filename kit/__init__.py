"""kit: launch multi-node PyTorch Lightning jobs on Slurm, with containers and metrics.

From Python (:mod:`kit.api`, the one face, loaded on first use so that ``import kit`` stays light for the
exporter and the trainer): ``kit.launch``, ``kit.submit``, ``kit.map``, ``kit.rerun``, ``kit.Job`` (a function
job's: ``kit.FunctionJob``), ``kit.jobs``, ``kit.KitError``.
"""

from kit import version as _version

__version__ = _version.__version__

_API = {"launch", "Job", "jobs", "Outcome", "rerun", "submit", "map", "RemoteError", "FunctionJob"}


def __getattr__(name: str):
    if name in _API:
        from kit import api

        return getattr(api, name)
    if name == "KitError":
        from kit.errors import KitError

        return KitError
    raise AttributeError(f"module 'kit' has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *_API, "KitError"})
