"""``python -m kit.preflight node [--out FILE]``: check this node, print its findings, write its record (exit 1
when it fails); ``python -m kit.preflight judge DIR --nodes N``: the verdict over N nodes' records in DIR (exit 1
when it fails). What the launcher runs before a ``--preflight`` job's command; light: no click."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from kit.preflight import burn, health, verdict


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kit.preflight")
    sub = p.add_subparsers(dest="what", required=True)
    node = sub.add_parser("node", help="check this node")
    node.add_argument("--out", help="write its record here (JSON); - for standard output")
    node.add_argument("--burn-seconds", type=float, default=burn.SECONDS)
    node.add_argument("--node", default=os.environ.get("SLURMD_NODENAME"))
    node.add_argument("--network", metavar="ADDR:PORT", help="then test the links with the other nodes' (rendezvous)")
    node.add_argument("--rank", type=int, default=0, help="with --network: this node's place among them")
    node.add_argument("--nodes", type=int, default=1, help="with --network: how many nodes take part")
    judged = sub.add_parser("judge", help="the verdict over the nodes' records in DIR")
    judged.add_argument("directory")
    judged.add_argument("--nodes", type=int, required=True)
    judged.add_argument("--timeout", type=float, default=300.0)
    args = p.parse_args(argv)
    if args.what == "judge":
        got = verdict.judge(Path(args.directory), args.nodes, args.timeout)
        print(f"preflight: {got['verdict']}" + (f": {got['why']}" if got["why"] else ""), flush=True)
        return 0 if got["verdict"] == "ok" else 1
    record = verdict.check_node(
        args.node,
        args.burn_seconds,
        say=lambda line: print(f"preflight {args.node}: {line}", file=sys.stderr, flush=True),
    )
    if args.network:
        from kit.preflight import link_test as network

        record["network"] = network.run(args.network, args.rank, args.nodes, record["node"])
    if args.out == "-":
        print(json.dumps(record), flush=True)
    else:
        for f in record["findings"]:
            print(f"preflight {record['node']}: {health.Finding(**f).line()}")
        if "network" in record:
            print(f"preflight {record['node']}: network {json.dumps(record['network'])}")
        print(
            f"preflight {record['node']}: {'ok' if record['ok'] else 'FAILED'} ({record['seconds']:.1f} s)", flush=True
        )
        if args.out:
            verdict.write_record(Path(args.out), record)
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
