"""kit from Python, notebook-sized: launch a 2-node Lightning job on the local cluster, follow
its progress, wait for its end, and read its report.

    kit cluster up --nodes 2 --prometheus
    python launch/examples/api_quickstart.py --max-steps 200

The same calls work against a site's Slurm (leave out ``local=True``). Prints one JSON line at
the end (what a pipeline step would keep) and exits with the job's exit code.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import kit


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-steps", type=int, default=200)
    p.add_argument("--output-dir", default="kit-jobs")
    args = p.parse_args()

    job = kit.launch(
        [sys.executable, "-m", "kit.train", "--max-steps", str(args.max_steps), "--log-every", "20"],
        nodes=2,
        local=True,
        output_dir=args.output_dir,
        job_name="api-quickstart",
    )
    for message in job.messages:
        print(f"kit: {message}")
    print(f"submitted job {job.id}: {job.dir}")
    steps = []
    while not job.done():
        progress = job.progress()
        if progress.step is not None and (not steps or progress.step != steps[-1]):
            steps.append(progress.step)
            loss = "-" if progress.loss is None else f"{progress.loss:.4g}"
            print(f"  {job.state()}: step {progress.step}/{progress.max_steps}, loss {loss}")
        time.sleep(1)
    end = job.wait()
    print(f"job {job.id} {end.describe()}")
    summary = job.report() if end.exit_code == 0 else {}
    print(
        json.dumps(
            {
                "job_id": job.id,
                "state": end.state,
                "exit_code": end.exit_code,
                "steps_seen": steps,
                "samples_per_second": summary.get("samples_per_second"),
            }
        )
    )
    return end.exit_code


if __name__ == "__main__":
    sys.exit(main())
