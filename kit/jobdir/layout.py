"""The job directory's layout: every file and directory kit writes into a job's
directory, named once (docs/job-directory.md lists the same).

In the manner of submitit's ``JobPaths``: code asks a :class:`JobDir` for a path
and never spells a name itself; the bash scripts (launch/) use the same names (a test
checks it). ``JobDir(d).task(3)`` is an array task's directory, laid out alike.
"""

from __future__ import annotations

import re
from pathlib import Path


class JobDir:
    """Paths in one job directory (or one array task's directory)."""

    # Written at preparation, before submission.
    PRELAUNCH = "prelaunch.sh"  # the batch script
    LAUNCHER = "launcher.sh"  # what every task runs
    ENV = "job.env"  # the job's values, each quoted once: both scripts source it
    # What the scripts source (launch/'s, as they ship): the shared functions, prelaunch's by concern.
    SCRIPT_PARTS = ("lib.sh", "prelaunch_step.sh", "prelaunch_watchdog.sh", "prelaunch_ending.sh")
    SPEC = "job.json"  # the resolved job spec
    SBATCH = "sbatch.json"  # the exact sbatch argv
    CODE = "code"  # the code snapshot's view: every run starts in it
    CODE_LIST = "code.list"  # what the view holds (prelaunch puts back what a run changed)
    COMMAND = "command"  # a sweep task's command, its values in place (NUL-separated words)
    SWEEP = "sweep"  # a sweep task's NAME=VALUE pairs (NUL-separated)
    PARAMS = "params.json"  # a sweep task's parameters
    # Written at submission, and by the commands that follow the job.
    JOB_ID = "job_id"  # written first after sbatch: it marks a submitted job
    SLURM = "slurm.json"  # which Slurm has the job
    CANCELLED = "cancelled.json"  # kit cancel: who, where, when, why
    OUTCOME = "outcome.json"  # the end Slurm gave the job when kit last saw it
    RERUN_OF = "rerun_of.json"  # kit rerun: the job this one reruns (its directory and id)
    # Written by the job.
    FINISHED = "FINISHED"  # the work is done: the job never runs (or requeues) again
    RUNS = "runs.jsonl"  # one line per run: how it ended
    NOTIFY = "notify"  # --notify's: sent.jsonl (one line per event and target sent or given up), lock
    NOTIFY_SENT = "sent.jsonl"
    NOTIFY_LOCK = "lock"
    STRAGGLERS = "stragglers.json"  # the ranks named slow, with their evidence (kit.jobdir.slow_ranks)
    CHECKPOINT_STEP = "checkpoint_step"
    LOGS = "logs"
    TASKS = "tasks"
    PROGRESS = "progress"
    HANG = "hang"
    METRICS = "metrics"
    CHECKPOINTS = "checkpoints"  # the reference trainer's; kit.train.checkpoint's shared tier and records:
    CKPT_SHARD = "rank-{rank}.step-{step}"  # a rank's state at a step (+ .pt, its bytes; + .json, its meta), any tier
    CKPT_STEP = "step-{step}"  # checkpoints/: one persisted step, a shard per rank (rank-<R>.pt + .json)
    CKPT_MANIFEST = "manifest.json"  # checkpoints/step-<N>/: written once every shard is (step, world, digests)
    CKPT_HELD = "held"  # checkpoints/held/<node>.json: what each node's keeper holds, by tier, rank and step
    CKPT_KEEPERS = "keepers"  # checkpoints/keepers/r<run>/<node>.json: where each node's keeper answers
    CKPT_TOKEN = ".token"  # checkpoints/: the job's secret the keepers ask of each other (0600)
    CKPT_INTERVAL = "interval.jsonl"  # checkpoints/: each persisting interval kit chose, and why
    CKPT_STRIDE = "stride"  # checkpoints/: snapshot every N-th step (a power of two: the ranks' largest)
    CKPT_RESTORE = "restore.r{run}.json"  # checkpoints/: the step run <run> resumed from, and each rank's source
    CKPT_LOADED = "loaded.r{run}.rank-{rank}.json"  # checkpoints/: what a rank loaded: tier, node, seconds
    PROFILES = "profiles"  # the reference trainer's --profile-steps traces: rank-<R>.json
    TRACKER = "tracker"  # the job's one tracker run ($KIT_TRACKER_DIR): W&B's files, TensorBoard's
    TRACKER_STEP = "logged_step.{tracker}"  # tracker/: the highest step the job's runs logged to a tracker
    TRACKER_MLFLOW = "mlflow.json"  # tracker/: the MLflow run the first run made (run_id, tracking_uri)
    TRACKER_TENSORBOARD = "tensorboard"  # tracker/: TensorBoard's one log directory for the job
    TRACKER_MLFLOW_DB = "mlflow.db"  # tracker/: the job's MLflow store when none is named (SQLite, full MLflow)
    TRACKER_MLRUNS = "mlruns"  # tracker/: the same as a file store (mlflow-skinny has no SQLite store)
    REPORT = "report.png"  # kit report's picture (report.json beside it)
    FUNCTION = "function.pkl"  # kit.submit: the call every rank makes (cloudpickle)
    RESULTS = "results"  # kit.submit: each rank's return value or exception
    PROGRESS_SEEN = "seen"  # progress/seen: some rank reported progress in some run (arms the watchdog)
    RUN = "r{run}"  # progress/r<run>/, hang/r<run>/: one run's
    # In progress/r<run>/ (prelaunch and the launchers talk through these).
    STEP_START = "step-start"  # prelaunch's clock just before srun
    WARNING = "warning"  # the time limit's warning, passed on to the launchers
    STOP = "stop"  # stop the commands (a restart is left, the limit is near)
    LIMIT_NEAR = "limit-near"  # Unix time: the launchers stop waiting for a handler for the warning then
    RANK_PROGRESS = "rank-{rank}"  # a rank's progress file
    TASK = "task-{rank}"  # where a rank runs: "node pid start"
    WARNED = "warned-{rank}"  # the rank's command was given the warning
    JOINED = "joined-{rank}"  # the rank's command reached the rendezvous
    TIMELINE = "timeline-{rank}"  # kit.train.progress's: "first|save|saved|last TIME STEP" lines (goodput's)
    PREFLIGHT_NODE = "preflight-{node}.json"  # --preflight: a node's checks and burn-in (kit.preflight)
    PREFLIGHT = "preflight"  # --preflight: the verdict over every node (verdict=, nodes=, why=, checked=)
    STRAGGLER = "straggler"  # the run's first straggler verdict (rank=, node=, factor=, why=: kit.jobdir.slow_ranks)
    STRAGGLER_STOP = "straggler-stop"  # --on-straggler requeue: prelaunch warned the command for it
    REQUEUED = "requeued"  # prelaunch requeued the job after this run: why (one line)
    EXITED = "exited.json"  # the batch script's last word after this run: {"code", "run", "stopped"}
    SIDECAR_ENDED = "sidecar-{name}.{node}"  # a sidecar that ended by itself (not torn down): "EXIT_CODE UNIX_TIME"
    # In hang/r<run>/ (after a hang: the watchdog asks, every rank answers).
    HANG_REQUEST = "request"  # "rank=R": the suspect; the launchers dump their stacks
    HANG_STACKS = "rank-{rank}.txt"  # a rank's process states and stacks
    HANG_REPORT = "report"  # rank, node, why
    HANG_STOP = "stop"  # the dump is over
    # In logs/.
    BATCH_LOG = "slurm-{job_id}.out"
    ARRAY_BATCH_LOG = "slurm-%A_%a.out"  # sbatch's pattern for an array task's batch log
    RANK_LOG = "rank-{rank}.r{run}.log"
    NODE_LOG = "{node}.r{run}"  # a node's logs begin so ($KIT_NODE_LOG_PREFIX)
    SIDECAR_LOG = NODE_LOG + ".{name}.log"
    METRICS_SUFFIX = ".metrics.jsonl"
    METRICS_LOG = NODE_LOG + METRICS_SUFFIX  # the exporter's record of its polls
    GPU_DMON_LOG = NODE_LOG + ".gutil"  # the gpu-dmon sidecar's nvidia-smi dmon output
    PREFLIGHT_LOG = NODE_LOG + ".preflight.log"  # --preflight: what the node's check and the verdict printed
    EXIT = "exit.r{run}.rank-{rank}"  # how a rank ended: "time rank rc self|stopped|warned"
    # In results/ (kit.submit).
    RESULT = "rank-{rank}.pkl"
    ERROR = "rank-{rank}.error.json"  # type, message, traceback, rank, node
    # In metrics/<node>/.
    RANK_METRICS = "rank-{rank}.json"

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"JobDir({str(self.path)!r})"

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    def task(self, index: int) -> JobDir:
        return JobDir(self.path / self.TASKS / str(index))

    @property
    def logs(self) -> Path:
        return self.path / self.LOGS

    @property
    def code(self) -> Path:
        return self.path / self.CODE

    def rank_log(self, rank: int | str, run: int | str) -> Path:
        return self.logs / self.RANK_LOG.format(rank=rank, run=run)

    def sidecar_logs(self, node: str | None, run: int, name: str) -> list[Path]:
        return sorted(self.logs.glob(self.SIDECAR_LOG.format(node=node or "*", run=run, name=name)))

    def batch_logs(self) -> list[Path]:
        return sorted(self.logs.glob(self.BATCH_LOG.format(job_id="*")))

    def metrics_logs(self) -> list[tuple[int, Path]]:
        """(run, path) of every exporter's metrics log, by name."""
        pattern = re.compile(re.escape(self.METRICS_LOG).replace(r"\{node\}", ".*").replace(r"\{run\}", r"(\d+)"))
        out = []
        for p in sorted(self.logs.glob(self.METRICS_LOG.format(node="*", run="*"))):
            m = pattern.fullmatch(p.name)
            out.append((int(m.group(1)) if m else 0, p))
        return out

    def exit_records(self, run: int) -> list[Path]:
        return sorted(self.logs.glob(self.EXIT.format(run=run, rank="*")))

    def rank_logs(self, run: int | str = "*") -> list[tuple[int, int, Path]]:
        """(run, rank, path) of every rank log (of run ``run``), in order."""
        pattern = re.compile(r"rank-(\d+)\.r(\d+)\.log")
        out = []
        for p in self.logs.glob(self.RANK_LOG.format(rank="*", run=run)):
            m = pattern.fullmatch(p.name)
            if m:
                out.append((int(m.group(2)), int(m.group(1)), p))
        return sorted(out)

    def run_progress(self, run: int) -> Path:
        return self.path / self.PROGRESS / self.RUN.format(run=run)

    @classmethod
    def patterns(cls) -> set[str]:
        """Every path kit writes in a job directory, relative, ``{...}`` for what varies:
        what the scripts' paths are checked against."""
        top = {
            cls.PRELAUNCH,
            cls.LAUNCHER,
            cls.ENV,
            *cls.SCRIPT_PARTS,
            cls.SPEC,
            cls.SBATCH,
            cls.COMMAND,
            cls.SWEEP,
            cls.PARAMS,
            cls.JOB_ID,
            cls.SLURM,
            cls.CANCELLED,
            cls.OUTCOME,
            cls.RERUN_OF,
            cls.CODE,
            cls.CODE_LIST,
            cls.FUNCTION,
            cls.FINISHED,
            cls.RUNS,
            cls.CHECKPOINT_STEP,
            cls.LOGS,
            cls.TASKS,
            cls.PROGRESS,
            cls.HANG,
            cls.METRICS,
            cls.CHECKPOINTS,
            cls.PROFILES,
            cls.REPORT,
            cls.TRACKER,
            cls.STRAGGLERS,
        }
        hang = {cls.HANG_REQUEST, cls.HANG_STACKS, cls.HANG_REPORT, cls.HANG_STOP}
        logs = {
            cls.BATCH_LOG,
            cls.RANK_LOG,
            cls.NODE_LOG,
            cls.SIDECAR_LOG,
            cls.METRICS_LOG,
            cls.GPU_DMON_LOG,
            cls.EXIT,
            cls.PREFLIGHT_LOG,
        }
        return (
            top
            | {
                f"{cls.PROGRESS}/{cls.PROGRESS_SEEN}",
                f"{cls.PROGRESS}/{cls.RUN}",
                f"{cls.HANG}/{cls.RUN}",
                f"{cls.METRICS}/{{node}}",
                f"{cls.METRICS}/{{node}}/{cls.RANK_METRICS}",
                f"{cls.TASKS}/{{index}}",
                f"{cls.PROFILES}/{cls.RANK_METRICS}",
            }
            | {f"{cls.PROGRESS}/{cls.RUN}/{n}" for n in cls._in_a_run()}
            | {f"{cls.HANG}/{cls.RUN}/{n}" for n in hang}
            | {f"{cls.LOGS}/{n}" for n in logs}
            | {f"{cls.RESULTS}/{cls.RESULT}", f"{cls.RESULTS}/{cls.ERROR}"}
            | {
                f"{cls.TRACKER}/{n}"
                for n in (
                    cls.TRACKER_STEP,
                    cls.TRACKER_MLFLOW,
                    cls.TRACKER_TENSORBOARD,
                    cls.TRACKER_MLFLOW_DB,
                    cls.TRACKER_MLRUNS,
                )
            }
            | {cls.NOTIFY, f"{cls.NOTIFY}/{cls.NOTIFY_SENT}", f"{cls.NOTIFY}/{cls.NOTIFY_LOCK}"}
        )

    @classmethod
    def _in_a_run(cls) -> set[str]:
        """What prelaunch and the launchers write in progress/r<run>/."""
        return {
            cls.STEP_START,
            cls.WARNING,
            cls.STOP,
            cls.LIMIT_NEAR,
            cls.RANK_PROGRESS,
            cls.TASK,
            cls.WARNED,
            cls.JOINED,
            cls.TIMELINE,
            cls.PREFLIGHT_NODE,
            cls.PREFLIGHT,
            cls.STRAGGLER,
            cls.STRAGGLER_STOP,
            cls.REQUEUED,
            cls.EXITED,
            cls.SIDECAR_ENDED,
        }

    def task_record(self, run: int, rank: int | str) -> Path:
        return self.run_progress(run) / self.TASK.format(rank=rank)

    def run_dirs(self, under: str) -> list[int]:
        """The runs that have a ``progress/r<run>`` (or ``hang/r<run>``) directory."""
        return sorted(int(p.name[1:]) for p in (self.path / under).glob("r*") if re.fullmatch(r"r\d{1,6}", p.name))

    def metrics_files(self) -> list[Path]:
        """Every rank's training metrics file, on every node (``metrics/<node>/rank-<R>.json``)."""
        return sorted(self.path.glob(f"{self.METRICS}/*/{self.RANK_METRICS.format(rank='*')}"))

    def result(self, rank: int | str) -> Path:
        return self.path / self.RESULTS / self.RESULT.format(rank=rank)

    def error(self, rank: int | str) -> Path:
        return self.path / self.RESULTS / self.ERROR.format(rank=rank)

    def errors(self) -> list[Path]:
        """Every rank's exception record (a function job's)."""
        return sorted((self.path / self.RESULTS).glob(self.ERROR.format(rank="*")))

    def result_ranks(self) -> list[int]:
        """The ranks that left a return value (a function job's), in order."""
        pattern = re.compile(re.escape(self.RESULT).replace(r"\{rank\}", r"(\d+)"))
        return sorted(
            int(m.group(1))
            for p in (self.path / self.RESULTS).glob(self.RESULT.format(rank="*"))
            if (m := pattern.fullmatch(p.name))
        )

    @property
    def tracker_run_id(self) -> str:
        """The job's one tracker run id (W&B's run id and name): the job directory's name, an array task's
        ``NAME-t<index>``; the same in every run and requeue, a new one for a rerun (a new directory).
        prelaunch's kit::tracker_env spells the same rule (a test holds the pair)."""
        parent = self.path.parent
        if parent.name == self.TASKS and self.path.name.isdigit():
            return f"{parent.parent.name}-t{self.path.name}"
        return self.path.name

    def task_indices(self) -> list[int]:
        """An array job's task indices (its ``tasks/<index>/``); [] for a single job."""
        return sorted(int(p.name) for p in (self.path / self.TASKS).glob("*") if p.name.isdigit())
