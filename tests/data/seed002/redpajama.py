"""Stands in for lit-gpt's pretrain/redpajama.py: prints the rank mapping it was given."""

import os
import sys

args = sys.argv[1:]


def get(name):
    return args[args.index(name) + 1]


print(
    "rank",
    get("--global_rank"),
    "of",
    get("--world_size"),
    "node",
    get("--node_rank"),
    "local",
    get("--local_rank"),
    "nodes",
    get("--num_nodes"),
    "faulthandler",
    os.environ.get("PYTHONFAULTHANDLER"),
    "nccl",
    os.environ.get("NCCL_DEBUG"),
    os.environ.get("NCCL_DEBUG_SUBSYS"),
    "debug",
    os.environ.get("DEBUG"),
    "master",
    bool(os.environ.get("MASTER_ADDR")),
    "seeded",
    bool(os.environ.get("GPT_GLOBAL_SEED")),
)
