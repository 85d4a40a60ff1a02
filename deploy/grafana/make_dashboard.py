#!/usr/bin/env python3
"""Writes dashboards/dgca.json, the Grafana dashboard for dgca-orchestrator.

The dashboard is generated so every panel's PromQL lives in one list that the
Prometheus integration test also reads (it evaluates each expression against
a real Prometheus scraping a real coordinator). Run after editing:
    python3 deploy/grafana/make_dashboard.py
"""
import json
import os

J = 'job=~"$job"'
N = 'node=~"$node"'

# (title, unit, [(expr, legend)], width, kind)
PANELS = [
    ("Job overview", None, None, 24, "row"),
    ("Jobs by state", "none", [("sum by (state) (dgca_jobs)", "{{state}}")], 6, "stat"),
    ("Progress (step, slowest rank)", "none",
     [(f"min by (job) (dgca_train_step{{{J}}})", "{{job}} step"),
      (f"max by (job) (dgca_train_target_steps{{{J}}})", "{{job}} total")], 6, "stat"),
    ("ETA", "s", [(f"job:dgca_train_eta_seconds{{{J}}}", "{{job}}")], 6, "stat"),
    ("Job samples/s", "none", [(f"job:dgca_train_samples_per_second:sum{{{J}}}", "{{job}}")], 6, "stat"),
    ("Throughput", None, None, 24, "row"),
    ("Samples/s per rank", "none",
     [(f"dgca_train_samples_per_second{{{J},{N}}}", "{{job}} rank {{rank}}")], 12, "timeseries"),
    ("Step time per rank (mean over 1m)", "s",
     [(f"rate(dgca_train_step_seconds_sum{{{J},{N}}}[1m]) / clamp_min(rate(dgca_train_step_seconds_count{{{J},{N}}}[1m]), 1e-9)",
       "{{job}} rank {{rank}}")], 12, "timeseries"),
    ("Data wait share", "percentunit",
     [(f"rate(dgca_data_wait_seconds_total{{{J},{N}}}[1m])", "{{job}} rank {{rank}}")], 12, "timeseries"),
    # Step less data wait less exposed communication, over the step: in data
    # parallel the others wait for a straggler, so its share is the highest.
    ("Compute share per rank (a straggler's is the highest)", "percentunit",
     [(f"(rate(dgca_train_step_seconds_sum{{{J},{N}}}[1m]) - rate(dgca_data_wait_seconds_total{{{J},{N}}}[1m])"
       f" - rate(dgca_comm_exposed_seconds_total{{{J},{N}}}[1m]))"
       f" / clamp_min(rate(dgca_train_step_seconds_sum{{{J},{N}}}[1m]), 1e-9)",
       "{{job}} rank {{rank}}")], 12, "timeseries"),
    ("Training", None, None, 24, "row"),
    ("Loss per head", "none", [(f"dgca_train_loss{{{J},{N}}}", "{{job}} rank {{rank}} {{head}}")], 12, "timeseries"),
    ("Learning rate", "none", [(f"max by (job) (dgca_train_learning_rate{{{J}}})", "{{job}}")], 6, "timeseries"),
    ("Gradient norm", "none", [(f"max by (job) (dgca_train_grad_norm{{{J}}})", "{{job}}")], 6, "timeseries"),
    ("Evaluation F1", "percentunit", [(f"dgca_eval_f1{{{J}}}", "{{job}} {{level}} {{kind}}")], 12, "timeseries"),
    ("Communication", None, None, 24, "row"),
    ("Exposed communication share", "percentunit",
     [(f"dgca_comm_exposed_ratio{{{J},{N}}}", "{{job}} rank {{rank}}"),
      (f"job:dgca_comm_exposed_ratio:avg{{{J}}}", "{{job}} mean")], 12, "timeseries"),
    ("All-reduce bus bandwidth", "Bps",
     [(f"dgca_comm_bus_bandwidth_bytes_per_second{{{J},{N}}}", "{{job}} rank {{rank}}")], 6, "timeseries"),
    ("All-reduce time share", "percentunit",
     [(f"rate(dgca_comm_allreduce_seconds_total{{{J},{N}}}[1m])", "{{job}} rank {{rank}}")], 6, "timeseries"),
    ("Memory and GPUs", None, None, 24, "row"),
    # Every rank's process, CPU or GPU: what `dgca diagnose` compares with
    # the plan's memory model on CPU ranks.
    ("Rank memory (peak resident set)", "bytes",
     [(f"dgca_rank_memory_peak_bytes{{{J},{N}}}", "{{job}} rank {{rank}}")], 6, "timeseries"),
    ("GPU utilization", "percentunit", [(f"dgca_gpu_utilization_ratio{{{N}}}", "{{node}} gpu {{gpu}}")], 6, "timeseries"),
    ("GPU memory used", "bytes", [(f"dgca_gpu_memory_used_bytes{{{N}}}", "{{node}} gpu {{gpu}}")], 6, "timeseries"),
    ("GPU power", "watt", [(f"dgca_gpu_power_watts{{{N}}}", "{{node}} gpu {{gpu}}")], 6, "timeseries"),
    ("Health", None, None, 24, "row"),
    ("Job state", "none", [(f"dgca_job_state{{{J}}} == 1", "{{job}}: {{state}}")], 8, "stat"),
    ("Agent heartbeat age", "s", [(f"dgca_worker_heartbeat_age_seconds{{{N}}}", "{{node}}")], 8, "timeseries"),
    ("Rank restarts", "none", [(f"sum by (job) (dgca_rank_restarts_total{{{J}}})", "{{job}}")], 8, "timeseries"),
]

# Panels that are legitimately empty without a GPU: the Prometheus test
# checks them only on GPU nodes.
GPU_ONLY = {"GPU utilization", "GPU memory used", "GPU power"}


def expressions():
    """Every (panel title, PromQL) pair of the dashboard, `$job`/`$node` kept."""
    out = []
    for title, _, targets, _, kind in PANELS:
        if kind == "row":
            continue
        for expr, _ in targets:
            out.append((title, expr))
    return out


def build():
    panels, x, y, pid = [], 0, 0, 1
    for title, unit, targets, w, kind in PANELS:
        h = 1 if kind == "row" else 8
        if x + w > 24:
            x, y = 0, y + 8
        p = {"id": pid, "title": title, "type": kind,
             "gridPos": {"x": x, "y": y, "w": w, "h": h}}
        if kind != "row":
            p["datasource"] = {"type": "prometheus", "uid": "dgca-prometheus"}
            p["targets"] = [{"refId": chr(65 + i), "expr": e, "legendFormat": l}
                            for i, (e, l) in enumerate(targets)]
            p["fieldConfig"] = {"defaults": {"unit": unit}, "overrides": []}
        else:
            p["collapsed"] = False
            p["panels"] = []
        panels.append(p)
        pid += 1
        x += w
        if kind == "row" or x >= 24:
            x, y = 0, y + h
    var = lambda name, q: {
        "name": name, "type": "query", "label": name,
        "datasource": {"type": "prometheus", "uid": "dgca-prometheus"},
        "query": {"query": q, "refId": name}, "definition": q,
        "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2,
        "current": {"selected": True, "text": "All", "value": "$__all"}}
    return {
        "uid": "dgca-training", "title": "dgca training", "schemaVersion": 38,
        "version": 1, "editable": True, "refresh": "5s",
        "time": {"from": "now-30m", "to": "now"},
        "tags": ["dgca"],
        "templating": {"list": [var("job", "label_values(dgca_train_step, job)"),
                                var("node", "label_values(dgca_worker_heartbeat_age_seconds, node)")]},
        "panels": panels,
    }


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "dashboards", "dgca.json")
    with open(path, "w") as f:
        json.dump(build(), f, indent=2)
        f.write("\n")
    print(f"wrote {path} ({len(expressions())} expressions)")
