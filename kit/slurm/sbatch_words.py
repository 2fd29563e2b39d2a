"""What `kit convert` knows of an sbatch script's words, as tables: the sbatch options kit has fields for, what kit
sets itself, torchrun's rendezvous options, setup lines, pyxis's flags as kit's container fields, the Pythons an
image may name."""

from __future__ import annotations

# sbatch option (long name, short letter) -> kit job-file field.
FIELDS = {
    "--job-name": "job_name",
    "-J": "job_name",
    "--nodes": "nodes",
    "-N": "nodes",
    "--ntasks-per-node": "ntasks_per_node",
    "--cpus-per-task": "cpus_per_task",
    "-c": "cpus_per_task",
    "--mem": "mem",
    "--time": "time",
    "-t": "time",
    "--partition": "partition",
    "-p": "partition",
    "--account": "account",
    "-A": "account",
    "--array": "array",
    "-a": "array",
    "--gpus-per-node": "gpus_per_node",
    "--container-image": "image",
}


INT_FIELDS = {"nodes", "ntasks_per_node", "cpus_per_task", "gpus_per_node"}


# What kit sets for every task: a script's own value would be wrong (or the same) under kit.
KIT_SETS = {
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "NODE_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "OMP_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
}


# torchrun / torch.distributed.launch options kit's PET_* variables give (written with $VARS in scripts).
RENDEZVOUS = {
    "--nnodes",
    "--node_rank",
    "--node-rank",
    "--master_addr",
    "--master-addr",
    "--master_port",
    "--master-port",
    "--rdzv_endpoint",
    "--rdzv-endpoint",
    "--rdzv_backend",
    "--rdzv-backend",
    "--rdzv_id",
    "--rdzv-id",
}


SETUP_WORDS = (
    "module",
    "source",
    ".",
    "cd",
    "echo",
    "printf",
    "conda",
    "ml",
    "set",
    "date",
    "hostname",
    "nvidia-smi",
    "mkdir",
    "scontrol",
)


# pyxis's options as kit's job fields: (field, how the value is kept).
CONTAINER_FIELDS = {
    "--container-mounts": ("mounts", "list"),
    "--container-workdir": ("container_workdir", "str"),
    "--container-name": ("container_name", "str"),
    "--container-env": ("container_env", "list"),
    "--container-writable": ("container_writable", True),
    "--container-readonly": ("container_writable", False),
    "--container-mount-home": ("container_mount_home", True),
    "--no-container-mount-home": ("container_mount_home", False),
    "--container-remap-root": ("container_remap_root", True),
    "--no-container-remap-root": ("container_remap_root", False),
}


PYTHONS = (
    "usr/bin/python",
    "bin/python",
    "usr/local/bin/python",
    "usr/bin/python3",
    "bin/python3",
    "usr/local/bin/python3",
)


def option(words: list[str], i: int) -> tuple[str, str | None, int]:
    """(name, value, next index) of the sbatch/srun option at ``words[i]``."""
    word = words[i]
    if word.startswith("--"):
        name, eq, value = word.partition("=")
        if eq:
            return name, value, i + 1
        if (
            i + 1 < len(words)
            and not words[i + 1].startswith("-")
            and name not in ("--exclusive", "--requeue", "--no-requeue", "--overcommit")
        ):
            return name, words[i + 1], i + 2
        return name, None, i + 1
    name = word[:2]
    if len(word) > 2:
        return name, word[2:], i + 1
    if i + 1 < len(words) and not words[i + 1].startswith("-"):
        return name, words[i + 1], i + 2
    return name, None, i + 1


def leading_options(words: list[str]) -> tuple[list[str], int]:
    """A command line's own options (``srun …``, ``sbatch …``: as NAME=VALUE), and the index of the first word
    after them (its command, its script)."""
    i, options = 1, []
    while i < len(words) and words[i].startswith("-"):
        name, value, i = option(words, i)
        options.append(name + (f"={value}" if value is not None else ""))
    return options, i
