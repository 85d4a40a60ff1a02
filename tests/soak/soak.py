#!/usr/bin/env python3
"""A seeded soak of the real programs on loopback (issue 28): for --minutes,
jobs are submitted and cancelled, rank processes and a second node's agent
are killed with SIGKILL, and the coordinator is killed and started again on
the same state dir and address, each at random from --seed. Then nothing more
is done to it and every job is followed to its end, and the run is checked:

  - every submitted job is listed exactly once, none is lost or duplicated,
    and none is listed that was not submitted;
  - every job is in a final state (SUCCEEDED, FAILED or CANCELLED);
  - no rank process of the soak's coordinator is left running (an orphan);
  - no job's checkpoint directory holds more than train.keep_checkpoints
    checkpoints plus the best one retention also keeps;
  - no rank token file (LOG_DIR/rank-R.A.token, the credential an agent
    hands a rank) of an ended job is left past the agents' sweep (100 s).

Not part of `make test` (it runs for minutes). Usage, from the checkout
(built: dgca-coordinator, dgca-worker, dgca):

  tests/soak/soak.py --seed 7 --minutes 20 [--build-dir build] [--data ../shared/data]

Prints each action as it goes, then a summary; exit 0 when every check holds,
1 when one does not, 2 on bad usage or when the programs are missing.
"""

import argparse
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

FINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


class Soak:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.build = os.path.abspath(args.build_dir)
        self.coord_bin = os.path.join(self.build, "coordinator", "dgca-coordinator")
        self.worker_bin = os.path.join(self.build, "worker", "dgca-worker")
        self.dgca_bin = os.path.join(self.build, "cli", "dgca")
        self.dir = tempfile.mkdtemp(prefix="dgca-soak.")
        self.state = os.path.join(self.dir, "state")
        os.mkdir(self.state, 0o700)
        self.address = None
        self.coord = None
        self.agent = None
        self.submitted = []
        self.actions = collections.Counter()
        self.keep = {}  # job id -> keep_checkpoints of its spec

    # --- processes -------------------------------------------------------
    def log(self, text):
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)

    def start_coordinator(self):
        info = os.path.join(self.state, "coordinator.json")
        if os.path.exists(info):
            os.unlink(info)
        listen = self.address or "127.0.0.1:0"
        out = open(os.path.join(self.dir, "coordinator.log"), "ab")
        # --heartbeat-timeout 15: a killed rank is noticed in seconds, not 30.
        self.coord = subprocess.Popen(
            [self.coord_bin, "--listen", listen, "--metrics-listen", "127.0.0.1:0",
             "--state-dir", self.state, "--worker-binary", self.worker_bin,
             "--heartbeat-timeout", "15", "--restart-node-wait", "20"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                with open(info) as f:
                    j = json.load(f)
                if j.get("pid") == self.coord.pid:
                    self.address = j["listen"]
                    return
            except (OSError, ValueError):
                pass
            if self.coord.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError("the coordinator did not start; see " + self.dir + "/coordinator.log")

    def start_agent(self):
        out = open(os.path.join(self.dir, "agent.log"), "ab")
        os.makedirs(os.path.join(self.dir, "agent"), exist_ok=True)
        self.agent = subprocess.Popen(
            [self.worker_bin, "agent", "--coordinator", self.address, "--token-file",
             os.path.join(self.state, "agent-token"), "--node-name", "soak-b", "--state-dir",
             os.path.join(self.dir, "agent"), "--heartbeat-interval", "0.5"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def dgca(self, *argv, timeout=60):
        env = dict(os.environ, DGCA_COORDINATOR=self.address,
                   DGCA_TOKEN_FILE=os.path.join(self.state, "token"))
        try:
            r = subprocess.run([self.dgca_bin, *argv], capture_output=True, text=True,
                               env=env, timeout=timeout)
            return r.returncode, r.stdout, r.stderr
        except subprocess.TimeoutExpired:
            return 124, "", "timed out"

    def jobs(self):
        rc, out, _ = self.dgca("list", "--json")
        if rc != 0:
            return None
        try:
            return json.loads(out).get("jobs", [])
        except ValueError:
            return None

    # --- actions ---------------------------------------------------------
    def submit(self):
        steps = self.rng.randrange(150, 700, 50)
        ranks = self.rng.choice([1, 2, 2])
        keep = self.rng.choice([2, 3])  # keep_checkpoints 1 is refused by the spec
        restarts = self.rng.choice([0, 1, 2])
        name = f"soak-{len(self.submitted)}"
        spec = os.path.join(self.dir, name + ".yaml")
        with open(spec, "w") as f:
            f.write(
                f"name: {name}\n"
                "model: {preset: tiny, hidden: 64}\n"
                "data:\n"
                f"  train: {self.args.data}/ecspell/train_law.txt\n"
                "  max_seq_len: 32\n"
                f"train: {{steps: {steps}, global_batch: {4 * ranks}, eval_every: 0,\n"
                f"        checkpoint_every: 25, keep_checkpoints: {keep},\n"
                f"        max_restarts: {restarts}, optimizer: {{lr: 1.0e-3}}}}\n"
                f"resources: {{ranks: {ranks}, device: cpu, threads_per_rank: 1}}\n"
                "tuning: {mode: off}\n")
        rc, out, err = self.dgca("submit", spec)
        if rc == 0 and out.strip():
            job = out.strip().splitlines()[0]
            self.submitted.append(job)
            self.keep[job] = keep
            self.log(f"submit {job} ({ranks} rank(s), {steps} steps, keep {keep}, "
                     f"max_restarts {restarts})")
        else:
            # A submit the coordinator did not answer (it may be down) is
            # not a job: it must not be listed either (checked at the end).
            self.log(f"submit refused or unanswered (rc {rc}): {err.strip()[:200]}")
        return True

    def active(self):
        js = self.jobs() or []
        return [j for j in js if j.get("state") not in FINAL]

    def cancel(self):
        act = self.active()
        if not act:
            return False
        job = self.rng.choice(act)["id"]
        rc, _, err = self.dgca("cancel", job)
        self.log(f"cancel {job}: rc {rc} {err.strip()[:120]}")
        return True

    def rank_pids(self):
        """(pid, job) of the rank processes of this soak's coordinator."""
        out = []
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
                with open(f"/proc/{d}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if stat[stat.rfind(")") + 2] == "Z":
                continue
            argv = [a.decode(errors="replace") for a in argv]
            if len(argv) < 2 or not argv[0].endswith("dgca-worker") or argv[1] != "rank":
                continue
            if self.address not in argv:
                continue
            job = argv[argv.index("--job") + 1] if "--job" in argv else "?"
            out.append((int(d), job))
        return out

    def kill_rank(self):
        pids = self.rank_pids()
        if not pids:
            return False
        pid, job = self.rng.choice(pids)
        os.kill(pid, signal.SIGKILL)
        self.log(f"kill -9 rank pid {pid} of {job}")
        return True

    def kill_agent(self):
        if self.agent and self.agent.poll() is None:
            self.agent.kill()
            self.agent.wait()
            self.log("kill -9 the agent of soak-b; starting it again")
        time.sleep(self.rng.uniform(0.5, 5))
        self.start_agent()
        return True

    def kill_coordinator(self):
        self.coord.kill()
        self.coord.wait()
        down = self.rng.uniform(0.5, 8)
        self.log(f"kill -9 the coordinator; down {down:.1f} s")
        time.sleep(down)
        self.start_coordinator()
        return True

    # --- the run ---------------------------------------------------------
    def run(self):
        self.start_coordinator()
        self.start_agent()
        self.log(f"soak in {self.dir}, coordinator {self.address}, seed {self.args.seed}, "
                 f"{self.args.minutes} min")
        end = time.time() + 60 * self.args.minutes
        weights = [("submit", 30), ("cancel", 8), ("kill_rank", 10), ("kill_agent", 4),
                   ("kill_coordinator", 4), ("wait", 44)]
        names = [w[0] for w in weights]
        while time.time() < end:
            what = self.rng.choices(names, [w[1] for w in weights])[0]
            if what == "submit" and len(self.active()) >= 6:
                what = "wait"  # bounded: at most 6 jobs queued or running
            if what == "wait":
                time.sleep(self.rng.uniform(1, 10))
                self.actions[what] += 1
            elif getattr(self, what)():
                self.actions[what] += 1
            else:
                self.actions[what + " (nothing to act on)"] += 1
        self.log("done acting; following every job to its end (up to 15 min)")
        drain_end = time.time() + 15 * 60
        while time.time() < drain_end:
            js = self.jobs()
            if js is not None and all(j.get("state") in FINAL for j in js):
                break
            time.sleep(5)
        return self.check()

    def check(self):
        problems = []
        js = self.jobs()
        if js is None:
            problems.append("dgca list --json failed at the end")
            js = []
        ids = [j["id"] for j in js]
        counts = collections.Counter(ids)
        for job in self.submitted:
            if counts[job] == 0:
                problems.append(f"lost: {job} was submitted and is not listed")
        for job, n in counts.items():
            if n > 1:
                problems.append(f"duplicated: {job} is listed {n} times")
            if job not in self.submitted:
                problems.append(f"unknown: {job} is listed but was never acknowledged")
        states = collections.Counter(j.get("state") for j in js)
        for j in js:
            if j.get("state") not in FINAL:
                problems.append(f"not final: {j['id']} is {j.get('state')}")
        # Orphans: rank processes of this coordinator whose job has ended.
        time.sleep(5)
        final = {j["id"] for j in js if j.get("state") in FINAL}
        for pid, job in self.rank_pids():
            if job in final:
                problems.append(f"orphan: rank pid {pid} of {job}, which has ended")
        # Retention: the newest keep_checkpoints plus (at most) the best.
        over = 0
        most = 0
        for job in self.submitted:
            d = os.path.join(self.state, "jobs", job, "checkpoints")
            if not os.path.isdir(d):
                continue
            n = len([c for c in os.listdir(d) if c.startswith("step-")])
            most = max(most, n)
            if n > self.keep[job] + 1:
                over += 1
                problems.append(f"retention: {job} keeps {n} checkpoints "
                                f"(keep_checkpoints {self.keep[job]})")
        # Rank tokens: the agent removes each when its rank has exited.
        tokens = 0
        for root in (self.state, os.path.join(self.dir, "agent")):
            for job in final:
                d = os.path.join(root, "jobs", job)
                if not os.path.isdir(d):
                    continue
                for f in os.listdir(d):
                    path = os.path.join(d, f)
                    # The agents sweep files a minute old every 30 s.
                    if (f.startswith("rank-") and f.endswith(".token")
                            and time.time() - os.path.getmtime(path) > 100):
                        tokens += 1
                        problems.append(f"token left: {os.path.join(d, f)} of {job}, which has ended")
        print()
        print("soak summary")
        print(f"  seed {self.args.seed}, {self.args.minutes} min, state {self.dir}")
        print("  actions: " + ", ".join(f"{k} {v}" for k, v in sorted(self.actions.items())))
        print(f"  jobs submitted {len(self.submitted)}, listed {len(ids)}; "
              + ", ".join(f"{k} {v}" for k, v in sorted(states.items())))
        print(f"  most checkpoints in one job: {most}; over retention: {over}")
        print(f"  rank token files left of ended jobs: {tokens}")
        print(f"  problems: {len(problems)}")
        for p in problems:
            print("   - " + p)
        return 0 if not problems else 1

    def stop(self):
        for p in (self.agent, self.coord):
            if p and p.poll() is None:
                p.terminate()
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
        for pid, _ in self.rank_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--minutes", type=float, default=20)
    ap.add_argument("--build-dir", default=os.path.join(here, "..", "..", "build"))
    ap.add_argument("--data", default=os.path.join(here, "..", "..", "..", "shared", "data"))
    ap.add_argument("--keep", action="store_true", help="keep the state dir (default: kept "
                    "only when a check fails)")
    args = ap.parse_args()
    args.data = os.path.abspath(args.data)
    if args.minutes <= 0:
        print("soak: --minutes must be > 0", file=sys.stderr)
        return 2
    s = Soak(args)
    for b in (s.coord_bin, s.worker_bin, s.dgca_bin):
        if not os.access(b, os.X_OK):
            print(f"soak: {b} is missing; build first (tools/build.sh)", file=sys.stderr)
            return 2
    if not os.path.isfile(os.path.join(args.data, "ecspell", "train_law.txt")):
        print(f"soak: no ECSpell data under {args.data} (--data)", file=sys.stderr)
        return 2
    rc = 1
    try:
        rc = s.run()
    finally:
        s.stop()
        if rc == 0 and not args.keep:
            shutil.rmtree(s.dir, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
