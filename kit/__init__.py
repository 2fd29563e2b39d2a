"""kit: launch multi-node PyTorch Lightning jobs on Slurm, with containers and metrics."""

__version__ = "0.1.0"
