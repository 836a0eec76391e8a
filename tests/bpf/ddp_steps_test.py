#!/usr/bin/env python3
"""Steps of a real PyTorch DDP job over gloo, found by the agent (label bpf; root).

`strata record --layers comm` watches testbed/workloads/ddp_train.py under Debian's /usr/bin/python3
with python3-torch: 2 ranks over gloo, the large model (3 gradient buckets per iteration). Every
gloo call has the same signature ("allreduce:0": the agent reads no gloo sizes), so only the timing
says where an iteration starts (agent/comm/step_detector.h). Checked on the store:
- each rank's calls are recorded (the 3 buckets of every iteration and DDP's start-up calls);
- each rank has as many steps as the iterations it ran, give or take EDGE_STEPS (DDP's first
  iteration runs before its buckets are rebuilt and is start-up to the detector);
- both ranks have the same number of steps (the detector used to cut one rank every 2 calls and the
  other every 3: 57 and 38 steps for the same 40 iterations).
STEPS iterations give more calls than the detector's first decision looks at (128 for p = 1), so
the decision made while the job runs is tested, not only the one at its end.
A second recording stops (--duration) while the job still runs, before the ranks made 128 calls (a
hotspot on rank 1 slows every iteration): the steps each rank ran so far are stored all the same, as
at a process's exit (they used to be held back for a decision that never came). The same holds for
the always-on `strata agent -o --duration`, which finds the job by its environment.
Usage: ddp_steps_test.py BUILD_DIR
"""
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "support"))
from harness import check, failures  # noqa: E402

B = os.path.abspath(sys.argv[1])
STRATA = os.path.join(B, "bin", "strata")
REPO = os.path.dirname(os.path.dirname(HERE))
WORKLOAD = os.path.join(REPO, "testbed", "workloads", "ddp_train.py")
PYTHON = "/usr/bin/python3"  # Debian's, with python3-torch (scripts/install-deps.sh)
STEPS = 50
BUCKETS = 3  # the large model's gradient buckets per iteration (bucket_cap_mb=1)
# Iterations a rank may have more or fewer steps than it ran: DDP's first iteration (start-up to the
# detector: its buckets are rebuilt after it), and one cut by the end of the recording.
EDGE_STEPS = 2
# The cut recording: rank 1 burns CUT_HOTSPOT_MS per iteration from its first, so CUT_DURATION_S
# holds at most CUT_DURATION_S / 0.6 s = 33 iterations (~100 calls, under the 128 of a first
# decision) and, after torch's start-up, some ten or more (the final decision needs three cycles
# of the longest candidate: 8 iterations).
CUT_DURATION_S = 20
CUT_HOTSPOT_MS = 600
FIRST_DECISION_CALLS = 128
# The cut run must see some ten iterations to judge its steps (the final decision needs three cycles
# of the longest candidate, 8 iterations): fewer calls mean the job or the watch did not start.
MIN_CUT_CALLS = 10 * BUCKETS
# The agent loads its probes before the job it is to find starts (a few seconds on a loaded machine;
# a job started earlier is found too, by the agent's scan, but its first calls would be missed).
AGENT_START_S = 3


def kill_job(marker):
    """SIGKILLs every process whose environment holds STRATA_JOB=marker (the spawned ranks inherit it)."""
    needle = ("STRATA_JOB=" + marker).encode()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % d, "rb") as f:
                if needle in f.read().split(b"\0"):
                    os.kill(int(d), signal.SIGKILL)
        except OSError:
            pass


def cut_run(tmp, shell):
    """The job watched by `strata record --duration` (shell "record") or by the always-on `strata agent
    -o --duration` that finds it by its environment (shell "agent"): both stop while the job runs."""
    db = os.path.join(tmp, "cut-%s.db" % shell)
    marker = "strata-ddp-steps-cut-%s-%d" % (shell, os.getpid())
    env = dict(os.environ, STRATA_JOB=marker)
    log = os.path.join(tmp, "cut-%s.log" % shell)
    job = [PYTHON, WORKLOAD, "--ranks", "2", "--steps", "100000", "--model", "large",
           "--fault", "host-hotspot:rank=1,start_step=1,ms=%d" % CUT_HOTSPOT_MS]
    what = "cut %s" % shell
    try:
        # Output to a file: the job outlives the recording and keeps a pipe open.
        with open(log, "w") as out:
            if shell == "record":
                rc = subprocess.run([STRATA, "record", "--window", "5", "--layers", "comm", "--duration",
                                     str(CUT_DURATION_S), "-o", db, "--"] + job,
                                    stdout=out, stderr=subprocess.STDOUT, env=env, timeout=300).returncode
            else:
                agent = subprocess.Popen([STRATA, "agent", "-o", db, "--window", "5", "--layers", "comm",
                                          "--select", "STRATA_JOB=" + marker, "--listen-metrics", "off",
                                          "--duration", str(CUT_DURATION_S)],
                                         stdout=out, stderr=subprocess.STDOUT)
                time.sleep(AGENT_START_S)  # its probes in place before the job starts
                subprocess.Popen(job, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
                rc = agent.wait(timeout=300)
    finally:
        kill_job(marker)
    print(open(log).read()[-800:])
    check(rc == 0, "%s: strata %s --duration exits 0 (got %d)" % (what, shell, rc))
    con = sqlite3.connect(db)
    ranks = [pid for (pid,) in con.execute("SELECT DISTINCT pid FROM processes WHERE rank >= 0 ORDER BY rank")]
    check(len(ranks) == 2, "%s: 2 rank processes recorded (%s)" % (what, ranks))
    steps = {pid: n for pid, n in con.execute("SELECT pid, count(*) FROM steps GROUP BY pid")}
    calls = {pid: n for pid, n in con.execute("SELECT pid, count(*) FROM collectives GROUP BY pid")}
    for pid in ranks:
        c, n = calls.get(pid, 0), steps.get(pid, 0)
        print("%s: pid %d: %d calls, %d steps" % (what, pid, c, n))
        check(c < FIRST_DECISION_CALLS, "%s: pid %d stopped before a first decision (%d calls < %d)"
              % (what, pid, c, FIRST_DECISION_CALLS))
        check(c >= MIN_CUT_CALLS, "%s: pid %d: its calls are recorded (%d >= %d)" % (what, pid, c, MIN_CUT_CALLS))
        # Every iteration but DDP's first and the one the recording cut is a step.
        want = c // BUCKETS - EDGE_STEPS
        check(n >= want, "%s: pid %d: %d steps stored for ~%d iterations (>= %d)" % (what, pid, n, c // BUCKETS, want))


def main():
    if os.geteuid() != 0:
        raise SystemExit("ddp_steps_test needs root (BPF)")
    if not os.path.exists(STRATA):
        raise SystemExit("missing " + STRATA + " (build strata)")
    if subprocess.run([PYTHON, "-c", "import torch"], capture_output=True).returncode != 0:
        raise SystemExit(PYTHON + " cannot import torch: install python3-torch (scripts/install-deps.sh)")
    with tempfile.TemporaryDirectory(prefix="strata-ddp-steps-") as tmp:
        db = os.path.join(tmp, "ddp.db")
        log = os.path.join(tmp, "record.log")
        with open(log, "w") as out:
            rc = subprocess.run([STRATA, "record", "--window", "5", "--layers", "comm", "-o", db, "--",
                                 PYTHON, WORKLOAD, "--ranks", "2", "--steps", str(STEPS), "--model", "large"],
                                stdout=out, stderr=subprocess.STDOUT, timeout=900).returncode
        text = open(log).read()
        print(text[-1500:])
        check(rc == 0, "strata record of the DDP job exits 0 (got %d)" % rc)
        # The workload prints one line per rank once every rank ran its STEPS iterations.
        ranks = {int(m.group(2)): int(m.group(1)) for m in re.finditer(r"^rank (\d+) pid (\d+) step_ms", text, re.M)}
        check(len(ranks) == 2, "the workload reports its 2 ranks (%s)" % ranks)
        con = sqlite3.connect(db)
        steps = {pid: n for pid, n in con.execute("SELECT pid, count(*) FROM steps GROUP BY pid")}
        calls = {pid: n for pid, n in con.execute("SELECT pid, count(*) FROM collectives GROUP BY pid")}
        for pid, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            print("rank %d pid %d: %d calls, %d steps" % (rank, pid, calls.get(pid, 0), steps.get(pid, 0)))
            check(calls.get(pid, 0) >= BUCKETS * (STEPS - 1),
                  "rank %d: its calls are recorded (%d >= %d)" % (rank, calls.get(pid, 0), BUCKETS * (STEPS - 1)))
            check(abs(steps.get(pid, 0) - STEPS) <= EDGE_STEPS,
                  "rank %d: %d steps for %d iterations (within %d)" % (rank, steps.get(pid, 0), STEPS, EDGE_STEPS))
        counts = [steps.get(pid, 0) for pid in ranks]
        check(len(counts) == 2 and counts[0] == counts[1], "both ranks have the same number of steps (%s)" % counts)
        cut_run(tmp, "record")
        cut_run(tmp, "agent")
    if failures:
        print("FAILED: %d check(s)" % len(failures))
        return 1
    print("PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
