"""monitoring/: the Prometheus config, alert rules (checked and unit-tested with
promtool) and the Grafana dashboard."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import yaml
from helpers import REPO, require

from kit.monitor import exporter, gpu, naming, node, training

MON = REPO / "monitoring"


def test_prometheus_config_is_valid(tmp_path):
    require("promtool")
    targets = tmp_path / "targets"
    targets.mkdir()
    shutil.copytree(MON / "rules", tmp_path / "rules")
    config = tmp_path / "prometheus.yml"
    config.write_text((MON / "prometheus.yml").read_text().replace("/shared/prometheus/kit-targets", str(targets)))
    proc = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The site config stores the drop-in spelling exactly as the local cluster's does.
    (job,) = yaml.safe_load(config.read_text())["scrape_configs"]
    assert job["metric_relabel_configs"] == naming.relabel_configs()


def test_alert_rules_pass_promtool_check_rules():
    require("promtool")
    proc = subprocess.run(
        ["promtool", "check", "rules", str(MON / "rules" / "kit-alerts.yml")], capture_output=True, text=True
    )
    assert proc.returncode == 0 and "SUCCESS: 8 rules found" in proc.stdout, proc.stdout + proc.stderr


RULE_TESTS = """
rule_files: [{rules}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'DCGM_FI_DEV_GPU_UTIL{{slurm_job_id="7",node="node1",gpu="0"}}'
        values: '1x30'
      - series: 'gpu_xid_errors_total{{slurm_job_id="7",node="node1",gpu="3"}}'
        values: '0 0 1 1 1'
      - series: 'gpu_clock_throttle_active{{slurm_job_id="7",node="node1",gpu="1",reason="hw_thermal_slowdown"}}'
        values: '1x10'
      - series: 'up{{job="kit",slurm_job_id="7",node="node2"}}'
        values: '0x5'
      - series: 'gpu_lost{{slurm_job_id="7",node="node2",gpu="5"}}'
        values: '0 0 1 1'
    alert_rule_test:
      - eval_time: 25m
        alertname: KitGpuIdle
        exp_alerts:
          - exp_labels: {{severity: warning, slurm_job_id: "7", node: node1, gpu: "0"}}
            exp_annotations:
              summary: "GPU 0 on node1 idle in job 7"
              description: "Under 5% utilization for 10 minutes while the job holds it."
      - eval_time: 3m
        alertname: KitGpuXidError
        exp_alerts:
          - exp_labels: {{severity: critical, slurm_job_id: "7", node: node1, gpu: "3"}}
            exp_annotations:
              summary: "XID 1 on GPU 3 of node1"
              description: "NVML reported an XID error in job 7; see DCGM_FI_DEV_XID_ERRORS for the code."
      - eval_time: 6m
        alertname: KitGpuThrottled
        exp_alerts:
          - exp_labels: {{severity: warning, slurm_job_id: "7", node: node1, gpu: "1", reason: hw_thermal_slowdown}}
            exp_annotations:
              summary: "GPU 1 on node1 throttled: hw_thermal_slowdown"
              description: "Clocks held down by hw_thermal_slowdown for 5 minutes in job 7."
      - eval_time: 1m
        alertname: KitGpuLost
        exp_alerts: []
      - eval_time: 2m
        alertname: KitGpuLost
        exp_alerts:
          - exp_labels: {{severity: critical, slurm_job_id: "7", node: node2, gpu: "5"}}
            exp_annotations:
              summary: "GPU 5 of node2 is lost"
              description: "NVML reports the GPU lost (fallen off the bus) in job 7; the job's ranks on it cannot go on. Drain the node."
      - eval_time: 3m
        alertname: KitExporterDown
        exp_alerts:
          - exp_labels: {{severity: warning, job: kit, slurm_job_id: "7", node: node2}}
            exp_annotations:
              summary: "kit exporter on node2 (job 7) is not answering"
              description: "The target file exists but scrapes fail."
"""


def test_alert_rules_fire_on_synthetic_series(tmp_path):
    require("promtool")
    tests = tmp_path / "tests.yml"
    tests.write_text(RULE_TESTS.format(rules=MON / "rules" / "kit-alerts.yml"))
    proc = subprocess.run(["promtool", "test", "rules", str(tests)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def exported_names() -> set[str]:
    names = {spec.name for spec, _ in gpu.FIELDS} | {
        gpu.THROTTLE.name,
        gpu.XID_LAST.name,
        gpu.XID_COUNT.name,
        gpu.XID_TIME.name,
        gpu.LOST.name,
        gpu.PROCESSES.name,
    }
    names |= {
        s.name
        for s in (
            node.CPU,
            node.MEM_TOTAL,
            node.MEM_AVAILABLE,
            node.NET_RX,
            node.NET_TX,
            node.DISK_R,
            node.DISK_W,
            *node.LOADS,
        )
    }
    names |= {spec.name for _, spec in training.FIELDS} | {exporter.SUCCESS.name, exporter.DURATION.name, "up"}
    return names


def test_grafana_dashboard_is_importable_and_uses_real_series():
    dash = json.loads((MON / "grafana" / "kit-dashboard.json").read_text())
    assert dash["uid"] == "kit-training-jobs" and dash["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["job_id"]["type"] == "query"
    assert {p["type"] for p in dash["panels"]} == {"timeseries", "stat"}
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    known = exported_names()
    titles = " ".join(p["title"] for p in dash["panels"])
    assert "per GPU" in titles and "per rank" in titles and "Node" in titles
    for panel in dash["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            expr = target["expr"]
            assert 'slurm_job_id=~"$job_id"' in expr, panel["title"]
            metrics = set(re.findall(r"\b([A-Za-z_][A-Za-z0-9_]*)\{", expr))
            assert metrics and metrics <= known, (panel["title"], metrics - known)


def test_alertmanager_config_is_valid():
    require("amtool")
    proc = subprocess.run(["amtool", "check-config", str(MON / "alertmanager.yml")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_alertmanager_routes_kit_alert_rules_to_a_webhook(tmp_path):
    """Debian's Prometheus with kit's rules and Debian's Alertmanager with monitoring/alertmanager.yml (its
    receiver's URL a loopback webhook, its waits shortened): a lost GPU in a job's scrape reaches the webhook as
    KitGpuLost with the job, node and GPU, firing — the same kind of receiver --notify posts a job's events to."""
    import time
    import urllib.request

    from helpers import Receiver, wait_for

    from kit.cluster.processes import free_ports

    require("prometheus")
    require("prometheus-alertmanager")
    receiver = Receiver()
    exposition = b'# TYPE gpu_lost gauge\ngpu_lost{gpu="0"} 1\n'
    metrics = Receiver()  # an exporter's answer: a GET of /metrics
    metrics.server.RequestHandlerClass.do_GET = lambda h: (
        h.send_response(200),
        h.send_header("Content-Type", "text/plain; version=0.0.4"),
        h.end_headers(),
        h.wfile.write(exposition),
    )
    prom_port, am_port = free_ports(2)
    am = yaml.safe_load((MON / "alertmanager.yml").read_text())
    am["receivers"][0]["webhook_configs"][0]["url"] = receiver.url + "/alerts"
    am["route"].update(group_wait="1s", group_interval="1s")
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(am))
    shutil.copytree(MON / "rules", tmp_path / "rules")
    prom = yaml.safe_load((MON / "prometheus.yml").read_text())
    prom["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] = [f"127.0.0.1:{am_port}"]
    host = metrics.url.removeprefix("http://")
    labels = {"slurm_job_id": "42", "node": "node1"}
    prom["scrape_configs"] = [{"job_name": "kit", "static_configs": [{"targets": [host], "labels": labels}]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(prom))
    logs = [open(tmp_path / f"{n}.log", "w") for n in ("alertmanager", "prometheus")]
    procs = [
        subprocess.Popen(
            ["prometheus-alertmanager", f"--config.file={tmp_path / 'alertmanager.yml'}",
             f"--storage.path={tmp_path / 'am'}", f"--web.listen-address=127.0.0.1:{am_port}",
             "--cluster.listen-address="],
            stdout=logs[0], stderr=subprocess.STDOUT,
        ),
        subprocess.Popen(
            ["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=logs[1], stderr=subprocess.STDOUT,
        ),
    ]  # fmt: skip
    try:
        began = time.time()
        alerts = wait_for(
            lambda: [a for _, body, _ in receiver.got for a in body["alerts"]],
            60,
            what="KitGpuLost at the webhook",
        )
        took = time.time() - began
        (alert,) = alerts
        assert alert["status"] == "firing" and alert["labels"]["alertname"] == "KitGpuLost", alert
        assert {k: alert["labels"][k] for k in ("slurm_job_id", "node", "gpu")} == {**labels, "gpu": "0"}
        assert alert["annotations"]["summary"] == "GPU 0 of node1 is lost"
        print(f"a lost GPU's scrape -> the webhook: {took:.1f} s (1 s scrapes and evaluations)")
        with urllib.request.urlopen(f"http://127.0.0.1:{prom_port}/api/v1/alertmanagers", timeout=5) as r:
            assert json.load(r)["data"]["activeAlertmanagers"], "Prometheus found the Alertmanager"
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
        for f in logs:
            f.close()
        receiver.close()
        metrics.close()
