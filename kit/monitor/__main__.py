"""``python -m kit.monitor`` (also ``kit exporter``): run the exporter.

Argparse, not Click: it runs inside job containers, which carry kit's runtime
but not necessarily Click.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import sys
from pathlib import Path

from kit.monitor.exporter import say
from kit.monitor.naming import NAMINGS


class _Formatter(argparse.HelpFormatter):
    """Help that starts "Usage:", like every other kit command."""

    def add_usage(self, usage, actions, groups, prefix=None):
        return super().add_usage(usage, actions, groups, prefix="Usage: " if prefix is None else prefix)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="kit exporter",
        formatter_class=_Formatter,
        description="Serve GPU (NVML), node (psutil), job (its processes) and training metrics to "
        "Prometheus, and advertise them through a file_sd target file.",
    )
    p.add_argument("--bind", default="0.0.0.0", help="Address to listen on [0.0.0.0].")
    p.add_argument("--port", default="9400-9499", help="Port, or LOW-HIGH: the first free one is used [9400-9499].")
    p.add_argument("--interval", type=float, default=1.0, help="Seconds between polls of NVML/psutil/training [1].")
    p.add_argument(
        "--targets-dir",
        default=os.environ.get("KIT_PROMETHEUS_TARGETS") or None,
        help="Write a file_sd target file here (and remove it on exit) [$KIT_PROMETHEUS_TARGETS].",
    )
    p.add_argument("--advertise", default=None, help="Host to put in the target file [this node's address].")
    p.add_argument(
        "--training-dir",
        default=os.environ.get("KIT_METRICS_DIR") or None,
        help="Where the ranks' training metric files are [$KIT_METRICS_DIR].",
    )
    p.add_argument("--log", default=None, help="Append one JSON line per poll to this file.")
    p.add_argument("--label", action="append", default=[], metavar="NAME=VALUE", help="Extra target label.")
    p.add_argument("--hostname-label", default="Hostname", help="GPU label carrying the host name ('' for none).")
    p.add_argument(
        "--naming",
        choices=NAMINGS,
        default=os.environ.get("KIT_EXPORTER_NAMING") or "prometheus",
        help="prometheus: snake_case names that promtool passes (kit's scrape config stores them as "
        "node_exporter/dcgm-exporter spell them); compat: serve node_exporter's and dcgm-exporter's "
        "own camelCase names [$KIT_EXPORTER_NAMING or prometheus].",
    )
    p.add_argument("--no-gpu", action="store_true", help="No NVML collector.")
    p.add_argument("--no-node", action="store_true", help="No node collector (a node_exporter already runs).")
    p.add_argument("--exit-with-parent", action="store_true", help="Exit when the parent process is gone.")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from kit.monitor.exporter import RESERVED_LABELS, Exporter, NoPort

    low, _, high = args.port.partition("-")
    try:
        port, port_max = int(low), int(high or low)
    except ValueError:
        return _usage("--port", f"not a port or LOW-HIGH range: {args.port!r}")
    if not 1 <= port <= port_max <= 65535:
        return _usage("--port", f"ports are 1-65535, LOW <= HIGH: got {args.port!r}")
    try:
        socket.getaddrinfo(args.bind, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError, ValueError) as e:
        return _usage("--bind", f"not an address to listen on: {args.bind!r} ({e})")
    if not (math.isfinite(args.interval) and 0.05 <= args.interval <= 3600):
        return _usage("--interval", f"seconds between polls, 0.05 to 3600: got {args.interval}")
    if args.naming not in NAMINGS:  # from $KIT_EXPORTER_NAMING, which argparse does not check
        return _usage("--naming", f"expected one of {', '.join(NAMINGS)}, got {args.naming!r}")
    labels = {}
    for item in args.label:
        name, sep, value = item.partition("=")
        if not sep or name in RESERVED_LABELS:
            return _usage("--label", f"expected NAME=VALUE with NAME not job or instance, got {item!r}")
        labels[name] = value
    node = os.environ.get("SLURMD_NODENAME") or None
    sources = _sources(args, node)
    exporter = Exporter(
        sources,
        interval=args.interval,
        bind=args.bind,
        port=port,
        port_max=port_max,
        targets_dir=Path(args.targets_dir) if args.targets_dir else None,
        labels=labels,
        log_path=Path(args.log) if args.log else None,
        node=node,
        advertise=args.advertise,
        naming=args.naming,
    )
    # Stop signals are caught before anything is written: whatever ends the
    # exporter from here on removes its target file.
    done = exporter.catch_signals()
    try:
        try:
            exporter.start()
        except NoPort as e:
            return _usage("--port", str(e))
        except OSError as e:
            say(f"kit exporter: cannot advertise to Prometheus: {e}")
            return 1
        say(
            f"kit exporter: serving on {args.bind}:{exporter.port}"
            + (f", target file {exporter.target_file}" if exporter.target_file else "")
        )
        exporter.serve_until(done, parent=os.getppid() if args.exit_with_parent else None)
    finally:
        exporter.stop(last=True)
    return 0


def _sources(args: argparse.Namespace, node: str | None) -> list:
    """What the exporter polls: NVML, the node, the ranks' training files; in a job what its processes use on this
    node and their links; on its first node the job's goodput and stragglers."""
    from kit.monitor.gpu import GpuSource, job_gpus
    from kit.monitor.job import JobSource
    from kit.monitor.node import NodeSource
    from kit.monitor.round_trips import LinkSource
    from kit.monitor.training import GoodputSource, StragglerSource, TrainingSource

    sources = []
    if not args.no_gpu:
        sources.append(
            GpuSource(
                hostname=socket.gethostname(), hostname_label=args.hostname_label, minors=job_gpus(os.environ), say=say
            )
        )
    if not args.no_node:
        sources.append(NodeSource())
    sources.append(TrainingSource(Path(args.training_dir) if args.training_dir else None))
    if os.environ.get("KIT_JOB_DIR") and os.environ.get("SLURM_NODEID") == "0":  # the job's time, from one node
        sources.append(GoodputSource(Path(os.environ["KIT_JOB_DIR"])))
        sources.append(StragglerSource(Path(os.environ["KIT_JOB_DIR"]), os.environ.get("KIT_PROGRESS_DIR")))
    if os.environ.get("SLURM_JOB_ID"):  # in a job: what the job's processes use on this node, its links
        job = JobSource(os.environ["SLURM_JOB_ID"], node)
        sources += [job, LinkSource(job.pids)]
    return sources


def _usage(field: str, message: str) -> int:
    say(f"kit: {field}: {message}")
    return 2


if __name__ == "__main__":
    code = main()
    # Its threads are left to the process's end, and nothing is left to finalize: the target file is gone, each
    # log line went out in one write. Under a job's teardown, at its low priority, the interpreter's own
    # finalization would be a share of the node's wait for the step to end.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
