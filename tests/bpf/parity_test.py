#!/usr/bin/env python3
"""One pipeline, two shells (label bpf; root): `strata record` and `strata agent -o` watching the
same strata-sim job at the same time store the same kinds of rows, in the same numbers.

The job is started by `strata record` through a launcher shell whose environment names a job
(STRATA_JOB), so the agent -- which scans /proc for training processes -- finds the shell before
the job begins and follows the ranks from their first instruction, as the recorder does.
Checked, per table, on the rows of the job's ranks:
- every kind of row one store holds, the other holds too;
- what the job decides (processes, communicators, collectives, steps, GPU device activity,
  per-process metric names, GPU kernels counted in metrics) agrees within PARITY_TOLERANCE; on-CPU
  samples, which each program's own perf events count, within that or SAMPLING_SIGMAS standard
  deviations of a Poisson count.
Per-process metrics are compared by the names stored and by a total the job decides (GPU kernels):
their row count is not decided by the job, since a row is one (window, name, label) and the two
programs' windows fall at their own phase (CI saw 2984 rows against 2794 with 28 and 26 windows),
and labels such as a neighbour's name or a histogram bucket come and go with the machine's load.
Windows, node-wide metrics and stats depend on how long each program ran (the agent runs before and
after the job), so only their presence is compared.
Usage: parity_test.py BUILD_DIR
"""
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
from harness import check, failures, free_port, metric, scrape  # noqa: E402

B = os.path.abspath(sys.argv[1])
STRATA = os.path.join(B, "bin", "strata")
SIM = os.path.join(B, "bin", "strata-sim")
# The two shells run one pipeline: what they store of one job may differ only by what the kernel
# delivered to each (samples near the job's first and last instant), not by what they do with it.
PARITY_TOLERANCE = 0.05
# On-CPU samples are counted, not decided by the job: each program has its own perf events, whose
# ticks fall at their own phase, and each steps its rate down (cost budget) in its own window. Two
# counts of the same work differ like draws of a Poisson count, so a gap of up to 3 standard
# deviations (3 * sqrt(N)) is allowed when that is more than PARITY_TOLERANCE.
SAMPLING_SIGMAS = 3
# Rank 0 burns this much CPU per step on the host (the sim's host-hotspot), so the ranks are
# sampled often enough for the comparison to mean something (about 9 s of CPU over 60 steps).
HOTSPOT_MS = 150


def counts(db):
    """{kind: count} of the job's rows (its ranks' pids) and of the time-driven tables."""
    con = sqlite3.connect("file:" + db + "?mode=ro", uri=True)
    try:
        rid = con.execute("SELECT MAX(id) FROM recordings").fetchone()[0]
        ranks = [r[0] for r in con.execute("SELECT DISTINCT pid FROM processes WHERE recording_id = ? AND rank >= 0",
                                           (rid,))]
        pids = "(" + ",".join(str(p) for p in ranks or [-1]) + ")"
        q = lambda sql: con.execute(sql.replace("PIDS", pids), (rid,)).fetchone()[0] or 0
        job = {
            "processes (ranks)": len(ranks),
            "communicators": q("SELECT COUNT(*) FROM communicators WHERE recording_id = ? AND pid IN PIDS"),
            "collectives": q("SELECT COUNT(*) FROM collectives WHERE recording_id = ? AND pid IN PIDS"),
            "steps": q("SELECT COUNT(*) FROM steps WHERE recording_id = ? AND pid IN PIDS"),
            "device_activity": q("SELECT COUNT(*) FROM device_activity WHERE recording_id = ? AND pid IN PIDS"),
            "on-CPU samples": q("SELECT SUM(value) FROM stack_counts WHERE recording_id = ? AND kind = 0 AND pid IN PIDS"),
            "metric names (per process)": q("SELECT COUNT(DISTINCT name) FROM metrics WHERE recording_id = ? AND pid IN PIDS"),
            "GPU kernels (metric sum)": q("SELECT SUM(value) FROM metrics WHERE recording_id = ? AND pid IN PIDS "
                                          "AND name = 'gpu.kernel_count'"),
        }
        present = {
            "metrics rows (per process)": q("SELECT COUNT(*) FROM metrics WHERE recording_id = ? AND pid IN PIDS"),
            "off-CPU rows": q("SELECT COUNT(*) FROM stack_counts WHERE recording_id = ? AND kind != 0 AND pid IN PIDS"),
            "launch_samples": q("SELECT COUNT(*) FROM launch_samples WHERE recording_id = ? AND pid IN PIDS"),
            "windows": q("SELECT COUNT(*) FROM windows WHERE recording_id = ?"),
            "metrics (node)": q("SELECT COUNT(*) FROM metrics WHERE recording_id = ? AND pid = 0"),
            "agent_stats": q("SELECT COUNT(*) FROM agent_stats WHERE recording_id = ?"),
            "stacks": con.execute("SELECT COUNT(*) FROM stacks").fetchone()[0],
            "frames (symbolized)": con.execute("SELECT COUNT(*) FROM frames WHERE function IS NOT NULL").fetchone()[0],
        }
        return job, present
    finally:
        con.close()


def main():
    tmp = tempfile.mkdtemp(prefix="strata-parity-")
    try:
        rdb, adb = os.path.join(tmp, "record.db"), os.path.join(tmp, "agent.db")
        job = f"parity-{os.getpid()}"
        port = free_port()
        agent = subprocess.Popen([STRATA, "agent", "-o", adb, "--window", "1", "--budget", "0", "--listen-metrics",
                                  f"127.0.0.1:{port}", "--select", "STRATA_JOB=" + job],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        # Only the launcher (and so the job) carries the job's name: the agent must not watch the
        # recorder. It waits for a line on stdin: the agent must have found it first.
        rec = subprocess.Popen([STRATA, "record", "-o", rdb, "--window", "1", "--budget", "0", "--", "env", "STRATA_JOB=" + job,
                                "sh", "-c", 'read go && exec "$0" "$@"', SIM, "run", "--ranks", "2", "--steps", "60",
                                "--fault", f"host-hotspot:rank=0,ms={HOTSPOT_MS}", "--quiet"],
                               stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        watched = None
        for _ in range(600):
            watched = metric(scrape(port, timeout=2), "strata_agent_watched_processes")
            if watched or agent.poll() is not None:
                break
            time.sleep(0.1)
        check(bool(watched), "the agent found the job's launcher before the job started")
        _, rerr = rec.communicate("go\n", timeout=600)
        check(rec.returncode == 0, f"record: exit {rec.returncode} {rerr.strip()[-500:]}")
        agent.terminate()
        _, aerr = agent.communicate(timeout=120)
        check(agent.returncode == 0, f"agent: exit {agent.returncode} {aerr.strip()[-500:]}")
        if failures:
            return 1
        rjob, rpresent = counts(rdb)
        ajob, apresent = counts(adb)
        print(f"{'rows':24} {'record':>10} {'agent -o':>10}")
        for k in rjob:
            print(f"{k:24} {rjob[k]:>10} {ajob[k]:>10}")
        for k in rpresent:
            print(f"{k:24} {rpresent[k]:>10} {apresent[k]:>10}")
        check(rjob["processes (ranks)"] == 2, f"record saw the 2 ranks ({rjob['processes (ranks)']})")
        for k in rjob:
            r, a = rjob[k], ajob[k]
            check((r > 0) == (a > 0), f"{k}: both stores hold them or neither does ({r}, {a})")
            if k == "on-CPU samples":
                bound = max(PARITY_TOLERANCE * max(r, a), SAMPLING_SIGMAS * max(r, a) ** 0.5)
                check(abs(r - a) <= bound, f"{k}: {r} vs {a} ({abs(r - a) / max(r, a, 1):.1%} apart; "
                                           f"at most {bound:.0f}, {SAMPLING_SIGMAS} standard deviations)")
            else:
                check(abs(r - a) <= PARITY_TOLERANCE * max(r, a), f"{k}: within {PARITY_TOLERANCE:.0%} ({r} vs {a})")
        for k in rpresent:
            r, a = rpresent[k], apresent[k]
            check((r > 0) == (a > 0), f"{k}: both stores hold them or neither does ({r}, {a})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
