#!/usr/bin/env python3
"""Submit-to-first-step latency of a 2-rank CPU job on a running coordinator.

For each run: t0 just before `dgca submit` is started; then `dgca status
--json JOB` is polled every 20 ms (plus the CLI's own ~10-30 ms per call);
the first poll where rank r reports step >= 1 gives that rank's latency.
Resolution is therefore one poll period (reported). Also reports when
`dgca submit` returned (job id printed) and when the job became RUNNING.
For a job with resources.launcher: slurm it also reports when `dgca status`
first showed the Slurm job's id (sbatch returned) and Slurm's RUNNING state.
Prints one JSON line per run and a summary line (medians).
Usage: latency.py DGCA_BIN COORD_ADDR TOKEN_FILE SPEC RUNS [LABEL]
"""
import json
import statistics
import subprocess
import sys
import time

dgca, addr, token, spec, runs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
label = sys.argv[6] if len(sys.argv) > 6 else ""
base = [dgca, "--coordinator", addr, "--token-file", token]
res = []
for run in range(runs):
    t0 = time.monotonic()
    out = subprocess.run(base + ["submit", spec], capture_output=True, text=True)
    t_sub = time.monotonic() - t0
    job = out.stdout.strip().split()[-1] if out.stdout.strip() else ""
    if out.returncode != 0 or not job:
        print("submit failed:", out.stdout, out.stderr, file=sys.stderr)
        sys.exit(1)
    first = {}
    t_running = None
    t_slurm_id = t_slurm_running = None
    polls, poll_s = 0, []
    while time.monotonic() - t0 < 120:
        p0 = time.monotonic()
        st = subprocess.run(base + ["status", "--json", job], capture_output=True, text=True)
        now = time.monotonic()
        polls += 1
        poll_s.append(now - p0)
        try:
            d = json.loads(st.stdout)
        except ValueError:
            time.sleep(0.02)
            continue
        j = d.get("job", {})
        if t_running is None and j.get("state") in ("RUNNING", "JOB_STATE_RUNNING"):
            t_running = now - t0
        launcher = j.get("launcher") or {}
        if t_slurm_id is None and launcher.get("job_id"):
            t_slurm_id = now - t0
        if t_slurm_running is None and launcher.get("state") == "RUNNING":
            t_slurm_running = now - t0
        for r in j.get("ranks", []):
            if int(r.get("step", 0) or 0) >= 1 and r.get("rank", 0) not in first:
                first[r.get("rank", 0)] = now - t0
        if len(first) >= 2 or j.get("state", "") in ("FAILED", "CANCELLED", "SUCCEEDED",
                                                      "JOB_STATE_FAILED", "JOB_STATE_CANCELLED",
                                                      "JOB_STATE_SUCCEEDED"):
            break
        time.sleep(0.02)
    subprocess.run(base + ["cancel", job], capture_output=True, text=True)
    # Wait for the ranks to be gone before the next run.
    for _ in range(200):
        st = subprocess.run(base + ["status", "--json", job], capture_output=True, text=True)
        try:
            s = json.loads(st.stdout)["job"]["state"]
        except (ValueError, KeyError):
            s = ""
        if "CANCELLED" in s or "SUCCEEDED" in s or "FAILED" in s:
            break
        time.sleep(0.05)
    rnd = lambda t: round(t, 3) if t is not None else None
    rec = dict(label=label, run=run, job=job, submit_returned_s=round(t_sub, 3),
               slurm_job_seen_s=rnd(t_slurm_id), slurm_running_seen_s=rnd(t_slurm_running),
               running_s=round(t_running, 3) if t_running else None,
               first_step_s={str(k): round(v, 3) for k, v in sorted(first.items())},
               poll_period_s=round(statistics.median(poll_s) + 0.02, 3))
    print(json.dumps(rec))
    if len(first) == 2:
        res.append((t_sub, max(first.values()), min(first.values()), statistics.median(poll_s) + 0.02,
                    t_slurm_id, t_slurm_running, t_running))
    time.sleep(0.5)
def median_of(i):
    xs = [r[i] for r in res if r[i] is not None]
    return round(statistics.median(xs), 3) if xs else None


if res:
    print(json.dumps(dict(summary=True, label=label, runs=len(res),
                          median_slurm_job_seen_s=median_of(4),
                          median_slurm_running_seen_s=median_of(5),
                          median_running_s=median_of(6),
                          median_submit_returned_s=round(statistics.median(r[0] for r in res), 3),
                          median_first_step_all_ranks_s=round(statistics.median(r[1] for r in res), 3),
                          median_first_step_first_rank_s=round(statistics.median(r[2] for r in res), 3),
                          median_poll_period_s=round(statistics.median(r[3] for r in res), 3))))
