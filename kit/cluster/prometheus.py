"""The local cluster's Prometheus: a real one on loopback that finds the jobs' exporters
through file_sd (the site template is monitoring/prometheus.yml)."""

from __future__ import annotations

import time

from kit.cluster.processes import free_ports
from kit.errors import KitError
from kit.monitor.naming import relabel_yaml


def alert_rules():
    """monitoring/rules/kit-alerts.yml: the checkout's kit was imported from, else shipped as the package
    ``kit.alerts``, else beside the package."""
    from pathlib import Path

    from kit.core.bash import checkout

    if (root := checkout()) is not None and (root / "monitoring" / "rules" / "kit-alerts.yml").is_file():
        return root / "monitoring" / "rules" / "kit-alerts.yml"
    try:
        from importlib.resources import files

        shipped = files("kit.alerts") / "kit-alerts.yml"
        if shipped.is_file():
            return Path(str(shipped))
    except (ImportError, TypeError):
        pass
    beside = Path(__file__).resolve().parents[2] / "monitoring" / "rules" / "kit-alerts.yml"
    return beside if beside.is_file() else None


def start(cluster, st, timeout: float, progress) -> None:
    """A real Prometheus on loopback that discovers job exporters through file_sd."""
    import subprocess
    import urllib.request

    d = cluster.root / "prometheus"
    cluster.prometheus_targets.mkdir(parents=True, exist_ok=True)
    (d / "data").mkdir(parents=True, exist_ok=True)
    rules = alert_rules()
    if rules is not None:  # kit's alerts (monitoring/rules), so they fire here as on a site
        (d / "rules").mkdir(exist_ok=True)
        (d / "rules" / rules.name).write_bytes(rules.read_bytes())
    (d / "prometheus.yml").write_text(
        "# Written by `kit cluster up --prometheus` (the site template is monitoring/prometheus.yml).\n"
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        + (f"rule_files: ['{d / 'rules'}/*.yml']\n" if rules is not None else "")
        + "scrape_configs:\n  - job_name: kit\n    file_sd_configs:\n"
        f"      - files: ['{cluster.prometheus_targets}/*.json']\n        refresh_interval: 5s\n"
        "    metric_relabel_configs:\n" + relabel_yaml(6)
    )
    port = free_ports(1)[0]
    progress(f"starting prometheus on 127.0.0.1:{port}")
    with open(cluster.root / "log" / "prometheus.log", "ab") as logf:
        proc = subprocess.Popen(
            # nice 19: on a real site Prometheus runs elsewhere; here it shares the jobs' cores.
            [
                "nice",
                "-n",
                "19",
                "prometheus",
                f"--config.file={d / 'prometheus.yml'}",
                f"--storage.tsdb.path={d / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=7d",
            ],
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=logf,
            start_new_session=True,
        )
    st.pids["prometheus"] = proc.pid
    st.prometheus_port = port
    cluster.save(st)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise KitError(
                "prometheus exited while starting",
                field="--prometheus",
                exit_code=1,
                detail=(cluster.root / "log" / "prometheus.log").read_text(errors="replace")[-2000:],
            )
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise KitError(f"prometheus not ready after {timeout:g} s", field="--prometheus", exit_code=1)
