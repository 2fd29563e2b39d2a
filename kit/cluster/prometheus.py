"""The local cluster's Prometheus: a real one on loopback that finds the jobs' exporters
through file_sd (the site template is monitoring/prometheus.yml)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from shlex import quote

from kit import files
from kit.cluster.processes import free_ports, user
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
    targets = cluster.prometheus_targets
    targets.mkdir(parents=True, exist_ok=True)
    os.chmod(targets, 0o755)  # the cluster owner's: each user's own directory in it (the Prolog's)
    (targets / user()).mkdir(mode=0o755, exist_ok=True)  # the owner's own
    (d / "data").mkdir(parents=True, exist_ok=True)
    rules = alert_rules()
    if rules is not None:  # kit's alerts (monitoring/rules), so they fire here as on a site
        (d / "rules").mkdir(exist_ok=True)
        (d / "rules" / rules.name).write_bytes(rules.read_bytes())
    files.write_atomic(
        d / "prometheus.yml.in",
        "# Written by `kit cluster up --prometheus` (the site template is monitoring/prometheus.yml).\n"
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        + (f"rule_files: ['{d / 'rules'}/*.yml']\n" if rules is not None else "")
        + "scrape_configs:\n  - job_name: kit\n    file_sd_configs:\n"
        f"      - refresh_interval: 5s\n        files:\n        {FILES_MARK}\n"
        # owner: the directory the target file is in (each user's own, made by the Prolog), never a label the
        # file says: a user's file cannot pass for another's target
        "    relabel_configs:\n      - source_labels: [__meta_filepath]\n"
        "        regex: '.*/([^/]+)/[^/]+'\n        target_label: owner\n"
        "    metric_relabel_configs:\n" + relabel_yaml(6),
        0o600,
    )
    files.write_atomic(d / "regen", regen_script(d, targets), 0o700)
    subprocess.run([str(d / "regen")], check=True, stdin=subprocess.DEVNULL)
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
    files.write_atomic(d / "pid", f"{proc.pid}\n", 0o600)  # regen's: whom to tell to read its config again
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


FILES_MARK = "# kit: a file_sd pattern per user directory (regen)"


def regen_script(d: Path, targets: Path) -> str:
    """``prometheus/regen``: prometheus.yml from its template, a file_sd pattern for each user's directory of the
    targets directory (made by root: the Prolog), then Prometheus told to read it again. file_sd takes a glob in a
    pattern's last part only (``targets/*/*.json`` is refused): each directory is a pattern of its own. Run by
    ``kit cluster up`` and by the Prolog after it made a user's directory."""
    yaml_dir = str(targets).replace("'", "''")
    return (
        "#!/usr/bin/env bash\n"
        "# Written by `kit cluster up --prometheus`: prometheus.yml, a file_sd pattern per user directory.\n"
        "set -euo pipefail\n"
        f"dir={quote(str(d))}\n"
        f"targets={quote(str(targets))}\n"
        'exec 9>"${dir}/.regen.lock"\n'
        "flock 9\n"
        'lines=""\n'
        'for path in "${targets}"/*; do\n'
        '  name="${path##*/}"\n'
        '  if [[ -d "${path}" && ! -L "${path}" && "${name}" =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]*$ ]]; then\n'
        f"    lines+=\"          - '{yaml_dir}/${{name}}/*.json'\"$'\\n'\n"
        "  fi\n"
        "done\n"
        'new=$(mktemp "${dir}/.prometheus.yml.XXXXXX")\n'
        "while IFS= read -r line; do\n"
        f'  if [[ "${{line}}" == *{quote(FILES_MARK)}* ]]; then printf "%s" "${{lines}}"; else printf "%s\\n" "${{line}}"; fi\n'
        'done <"${dir}/prometheus.yml.in" >"${new}"\n'
        'chmod 0600 "${new}"\n'
        'mv -f "${new}" "${dir}/prometheus.yml"\n'
        'pid=""\n'
        '{ read -r pid <"${dir}/pid"; } 2>/dev/null || true\n'
        'comm=""\n'
        'if [[ "${pid}" =~ ^[0-9]+$ ]]; then { read -r comm <"/proc/${pid}/comm"; } 2>/dev/null || true; fi\n'
        'if [[ "${comm}" == prometheus ]]; then kill -HUP "${pid}"; fi\n'
    )
