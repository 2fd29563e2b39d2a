"""Every `kit launch` option, declared once (in the manner of pyxis's ``args.c``).

One :class:`Option` per option: its field name, kind, default, minimum, help
group, help text and command-line spelling. From this table derive the
:class:`kit.core.spec.JobSpec` fields, its defaults, the job file's value
types, the minimums :func:`kit.core.spec.resolve` checks, the Click options of
``kit launch``, its grouped ``--help`` with every ``[default: …]``, and the
labels errors name fields by. Options with ``spec=False`` steer the command
(where to submit, what to print) and are not part of a job.

Adding an option: one entry here, plus the code that uses the value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# kinds: how a value is typed in a job file and taken on the command line
INT, STR, LIST, TABLE, SWEEP = "int", "str", "list", "table", "sweep"
SWITCH = "switch"  # --x/--no-x
FLAG = "flag"  # --x (True when given)
OFF = "off"  # --no-x (False when given)
BOOLS = (SWITCH, FLAG, OFF)
CHOICE = "choice"  # one of several flags, each giving its own value (--local/--site)


@dataclass(frozen=True)
class Option:
    name: str  # the JobSpec field (a job file's key, dashes or underscores)
    kind: str
    group: str
    help: str
    default: Any = None  # None: no default (the option is simply not given)
    minimum: int | None = None
    flag: str | None = None  # the command line's spelling, when not --name-with-dashes
    metavar: str | None = None
    default_text: str | None = None  # the help's [default: …] when the default is not a plain value
    spec: bool = True  # False: steers `kit launch` itself, not part of a job
    short: str | None = None
    choices: tuple[tuple[str, str, str], ...] = ()  # CHOICE: (flag, value, help) each

    @property
    def label(self) -> str:
        """How the command line spells it (errors name fields so)."""
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def python_type(self) -> Any:
        return {INT: int, STR: str, LIST: list, TABLE: dict, SWEEP: dict}.get(self.kind, bool)

    @property
    def help_text(self) -> str:
        shown = self.default_text
        if shown is None and self.kind in (INT, STR) and self.default is not None:
            shown = str(self.default)
        if shown is None:
            return self.help
        return f"{self.help.rstrip('.')} [default: {shown}]."


RESOURCES, COMMAND, MANY, CONTAINER, METRICS, RECOVERY, NETWORK, SUBMISSION = (
    "Resources",
    "Command and environment",
    "Sweeps, arrays and chains",
    "Container",
    "Metrics",
    "Preemption and recovery",
    "Networking",
    "Submission",
)

# `kit launch --help`, by topic; docs/launch.md's option table follows the same order.
GROUPS: tuple[tuple[str, str], ...] = (
    (RESOURCES, "What the job holds on the cluster."),
    (COMMAND, "What runs in every task, and with which variables."),
    (MANY, "Many tasks from one command; jobs that wait for others."),
    (CONTAINER, "Every task in a container image, through pyxis and enroot."),
    (METRICS, "The Prometheus exporter beside the training on each node."),
    (RECOVERY, "The time limit's warning, requeues, hangs and how long a stop may take."),
    (NETWORK, "The rendezvous address and port, and MPI."),
    (SUBMISSION, "Where the job goes, and what kit launch prints or waits for."),
)

OUTPUT_DIR = "kit-jobs"  # where job directories go, and where the commands look a job id up

OPTIONS: tuple[Option, ...] = (
    # Resources
    Option("nodes", INT, RESOURCES, "Number of nodes.", default=1, minimum=1),
    Option("gpus_per_node", INT, RESOURCES, "GPUs per node.", default=0, minimum=0),
    Option(
        "ntasks_per_node",
        INT,
        RESOURCES,
        "Tasks (ranks) per node.",
        minimum=1,
        default_text="GPUs per node, at least 1",
    ),
    Option("cpus_per_task", INT, RESOURCES, "CPUs per task.", minimum=1),
    Option("mem", STR, RESOURCES, "Memory per node, e.g. 64G (Slurm --mem).", metavar="SIZE"),
    Option("time", STR, RESOURCES, "Time limit: minutes, HH:MM:SS or D-HH:MM:SS.", metavar="LIMIT"),
    Option("partition", STR, RESOURCES, "Slurm partition.", metavar="NAME"),
    Option("account", STR, RESOURCES, "Slurm account.", metavar="NAME"),
    # Command and environment
    Option(
        "job_file",
        STR,
        COMMAND,
        "TOML job file; options given here override its values.",
        spec=False,
        short="-f",
        metavar="FILE",
    ),
    Option("job_name", STR, COMMAND, "Job name.", default="kit", metavar="NAME"),
    Option("env", TABLE, COMMAND, "A variable for every task (repeatable).", default={}, metavar="KEY=VALUE"),
    Option(
        "debug",
        SWITCH,
        COMMAND,
        "set -x, NCCL_DEBUG=INFO, TORCH_DISTRIBUTED_DEBUG=INFO, CUDA_LAUNCH_BLOCKING=1 (--env beats each).",
        default=False,
    ),
    Option(
        "sidecars",
        LIST,
        COMMAND,
        "A bash command local rank 0 runs beside the training on each node "
        "(repeatable); 'NAME: COMMAND' names it (its log: logs/<node>.r<run>.NAME.log).",
        default=[],
        flag="--sidecar",
        metavar="COMMAND",
    ),
    Option(
        "output_dir",
        STR,
        COMMAND,
        "Where job directories go.",
        default=OUTPUT_DIR,
        metavar="DIR",
        default_text="./kit-jobs",
    ),
    Option("command", LIST, COMMAND, "The command every task runs (after --).", flag="command", spec=True),
    Option(
        "code",
        STR,
        COMMAND,
        "Snapshot this directory's files (it must contain the one kit launch runs in); "
        "every run of the job runs the snapshot.",
        metavar="DIR",
        default_text="the git work tree kit launch runs in: tracked and unignored files, as they are",
    ),
    Option(
        "code_snapshot",
        OFF,
        COMMAND,
        "No code snapshot: each run runs the files as they are when it starts.",
        default=True,
        flag="--no-code-snapshot",
    ),
    # Sweeps, arrays and chains
    Option(
        "array",
        STR,
        MANY,
        "Run the job as a Slurm array of tasks, each its own unit of work (own directory, "
        "requeue and port): 0-9, 1,3,5, 0-99%8 (at most 8 at once); with --sweep, %K alone.",
        metavar="SPEC",
    ),
    Option(
        "sweep",
        SWEEP,
        MANY,
        "A parameter swept over: one array task per combination of all --sweep values; "
        "{NAME} in the command and $KIT_SWEEP_NAME give each task its value (repeatable).",
        flag="--sweep",
        metavar="NAME=V1,V2,...",
    ),
    Option(
        "after",
        LIST,
        MANY,
        "Start only after JOB (a job id or a kit job directory) succeeded (ok, the "
        "default), ended however (any) or failed (notok); checked before submitting (repeatable).",
        default=[],
        metavar="JOB[:ok|any|notok]",
    ),
    # Container
    Option(
        "image",
        STR,
        CONTAINER,
        "Run every task in this container image: a .sqsh path or docker://... (pyxis).",
        metavar="IMAGE",
    ),
    Option(
        "mounts",
        LIST,
        CONTAINER,
        "Bind SRC (absolute, on the nodes) at DST in the container; flags like ro, joined with + (repeatable).",
        default=[],
        flag="--mount",
        metavar="SRC:DST[:FLAGS]",
    ),
    Option(
        "container_workdir",
        STR,
        CONTAINER,
        "Working directory in the container.",
        metavar="PATH",
        default_text="the image's",
    ),
    Option(
        "container_env",
        LIST,
        CONTAINER,
        "More variables whose job values win over the image's (kit's own are always listed).",
        default=[],
        metavar="NAME[,NAME...]",
    ),
    Option("container_name", STR, CONTAINER, "Name under which pyxis keeps the container on the node.", metavar="NAME"),
    Option("container_writable", FLAG, CONTAINER, "Writable root filesystem in the container.", default=False),
    Option(
        "container_mount_home",
        SWITCH,
        CONTAINER,
        "Bind the home directory into the container.",
        default=False,
        default_text="no",
    ),
    Option("container_remap_root", FLAG, CONTAINER, "Be root inside the container (pyxis).", default=False),
    Option(
        "mount_check",
        OFF,
        CONTAINER,
        "Do not check that mount sources exist on this host (node-local paths).",
        default=True,
        flag="--no-mount-check",
    ),
    # Metrics
    Option(
        "exporter", OFF, METRICS, "No Prometheus exporter sidecar on the nodes.", default=True, flag="--no-exporter"
    ),
    Option(
        "exporter_ports",
        STR,
        METRICS,
        "Ports the exporter may take, first free one.",
        default="9400-9499",
        metavar="LOW-HIGH",
    ),
    Option(
        "prometheus_targets",
        STR,
        METRICS,
        "Directory Prometheus watches (file_sd).",
        metavar="DIR",
        default_text="the local cluster's, when it runs Prometheus",
    ),
    # Preemption and recovery
    Option("signal", STR, RECOVERY, "Warning signal sent before the time limit.", default="USR1", metavar="SIG"),
    Option("signal_lead", INT, RECOVERY, "Seconds before the time limit to send it.", default=90, minimum=1),
    Option(
        "max_restarts", INT, RECOVERY, "How often the job may requeue itself after the warning.", default=3, minimum=0
    ),
    Option(
        "hang_timeout",
        INT,
        RECOVERY,
        "Stop and requeue the run when a rank reports no progress for this many seconds; 0: off.",
        default=900,
        minimum=0,
    ),
    Option(
        "first_progress_timeout",
        INT,
        RECOVERY,
        "The same before a rank's first progress in a run.",
        default=3600,
        minimum=0,
    ),
    Option(
        "preflight",
        FLAG,
        RECOVERY,
        "Check every node before the command starts (GPU health through NVML, a matmul burn-in against the peak "
        "and the other nodes); a failing node is left out of the next run.",
        default=False,
    ),
    Option(
        "preflight_network",
        FLAG,
        RECOVERY,
        "With --preflight (implied): also an all-reduce across the nodes, then each pair of nodes alone, in the "
        "job's own image (gloo; NCCL's fabric is the GPUs'); a node whose every link is slow fails.",
        default=False,
    ),
    Option(
        "spare_nodes",
        INT,
        RECOVERY,
        "Nodes allocated beyond --nodes, idle until a restart needs them: a run that leaves a node out (a hang's, "
        "a straggler's, a failed preflight's) starts again in the allocation on a spare instead of being requeued.",
        default=0,
        minimum=0,
        metavar="K",
    ),
    Option(
        "on_straggler",
        STR,
        RECOVERY,
        "What a rank named a straggler does to the run: tell (the verdict is told, the job runs on), requeue (the "
        "command is warned to checkpoint and stop, and the job requeued without the rank's node, while a restart is "
        "left) or restart (the same, but the next run starts in the allocation, a new srun step, where the partition "
        "has no node to spare for it).",
        default="tell",
        metavar="ACTION",
    ),
    Option(
        "on_failure",
        STR,
        RECOVERY,
        "What a rank's failure (a command that exits non-zero by itself) does to the job: stop (the job fails with "
        "its exit code) or restart (the next run starts in the allocation from the last checkpoint, a new srun step, "
        "while --max-restarts allow: the failed rank's node left out where a spare node takes its place; then the "
        "job fails with the command's code).",
        default="stop",
        metavar="ACTION",
    ),
    Option(
        "stop_grace",
        INT,
        RECOVERY,
        "Seconds a command may take to exit after a stop signal before it is killed.",
        default=3,
        minimum=1,
    ),
    Option(
        "step_wait",
        INT,
        RECOVERY,
        "Seconds the other ranks may run on after one exits (srun --wait).",
        default=60,
        minimum=1,
    ),
    Option(
        "heartbeat", INT, RECOVERY, "Seconds between heartbeat lines in the batch log; 0: none.", default=60, minimum=0
    ),
    # Networking
    Option("port_range", STR, NETWORK, "Where MASTER_PORT is looked for.", default="29500-30499", metavar="LOW-HIGH"),
    Option("master_interface", STR, NETWORK, "Take MASTER_ADDR from this network interface.", metavar="IFACE"),
    Option(
        "mpi",
        STR,
        NETWORK,
        "Slurm's MPI plugin for the step (srun --mpi), checked against the cluster's `srun --mpi=list`.",
        default="none",
        metavar="TYPE",
    ),
    # Submission
    Option(
        "where",
        CHOICE,
        SUBMISSION,
        "Which Slurm to submit to.",
        spec=False,
        choices=(
            ("--local", "local", "Submit to kit's local cluster (the default when no site Slurm is configured)."),
            ("--site", "site", "Submit to the site's Slurm."),
        ),
    ),
    Option(
        "sbatch_args",
        LIST,
        SUBMISSION,
        "Pass an option to sbatch as is, e.g. --sbatch-arg=--constraint=a100 (repeatable).",
        default=[],
        flag="--sbatch-arg",
        metavar="OPTION",
    ),
    Option(
        "notify",
        LIST,
        SUBMISSION,
        "Send the job's events (started, first step, warned, hang, straggler, requeued, ended) to TARGET, each "
        "once: https://HOST/PATH (JSON), slack:https://HOST/PATH or mailto:ADDRESS[?smtp=HOST[:PORT]] (repeatable).",
        default=[],
        metavar="TARGET",
    ),
    Option(
        "dry_run", FLAG, SUBMISSION, "Write the job directory and print the sbatch line; submit nothing.", spec=False
    ),
    Option("wait", FLAG, SUBMISSION, "Block until the job ends; exit with its exit code.", spec=False),
    Option("as_json", FLAG, SUBMISSION, "Print {job_id, job_dir, sbatch_argv} as JSON.", flag="--json", spec=False),
    Option("parsable", FLAG, SUBMISSION, "Print only the job id, as sbatch --parsable does (for scripts).", spec=False),
)

BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}
SPEC_OPTIONS: tuple[Option, ...] = tuple(o for o in OPTIONS if o.spec)
