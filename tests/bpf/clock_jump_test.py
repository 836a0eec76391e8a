#!/usr/bin/env python3
"""Wall-clock steps during a recording (label bpf; root).

The machine's clock is shared and never touched: an LD_PRELOAD shim (tests/testprogs/clockjump.c)
steps CLOCK_REALTIME of the processes it is loaded in, an hour ahead 2 s after they start and an
hour behind (net) 2 s later, as NTP or `date -s` would step a real node. Both `strata record` and
`strata agent` run with it, beside a 2-rank strata-sim job that sees the same steps.

Checks, on each store:
- the run ends normally (exit 0) and saw both steps (wall_clock_steps / the agent's /metrics);
- windows are sane: none negative, none longer than a few windows (never the hour of a step), in
  order, inside the recording's start..end, which itself spans about the run's real length;
- every time stored (collectives, steps, kernels, metrics, process starts) lies inside the
  recording and per rank the collectives are in call order: one timeline, whatever the clock did;
- nothing lost: every on-CPU sample taken is in a window; every collective and step of each rank
  is there (the agent finds the job's launching shell before the job starts, so it follows the
  ranks from their first instruction, as record does).
Usage: clock_jump_test.py BUILD_DIR
"""
import json
import os
import re
import signal
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
SHIM = os.path.join(B, "testprogs", "libstrata_clockjump.so")
JUMPS = "2:+3600,4:-7200"  # net: an hour behind from 4 s on (each run lasts 8 s or more)
HOUR = 3600e9
WINDOW_S = 1
MAX_WINDOW_NS = 30e9  # generous: windows close every second; a step would make one an hour long


def rows(db, sql, args=()):
    con = sqlite3.connect("file:" + db + "?mode=ro", uri=True)
    try:
        return con.execute(sql, args).fetchall()
    finally:
        con.close()


def shim_env():
    env = dict(os.environ)
    env["LD_PRELOAD"] = SHIM
    env["STRATA_CLOCK_JUMPS"] = JUMPS
    return env


def read_truth(path):
    with open(path) as f:
        return {p["pid"]: p for p in json.load(f)["per_rank"]}


def check_store(name, db, real_start_ns, real_end_ns, truth):
    """The common checks on one store."""
    rec = rows(db, "SELECT id, started_ns, ended_ns FROM recordings ORDER BY id DESC LIMIT 1")
    check(len(rec) == 1 and rec[0][2] is not None, f"{name}: one recording, ended")
    if not rec or rec[0][2] is None:
        return
    rid, started, ended = rec[0]
    # The timeline starts at the wall clock of the start (before any step) and runs as long as
    # the run ran: both checked against this test's own, unshifted, clock with wide margins.
    check(abs(started - real_start_ns) < 60e9,
          f"{name}: recording starts at the real start ({(started - real_start_ns) / 1e9:+.1f} s)")
    length = ended - started
    real_length = real_end_ns - real_start_ns
    check(0 < length <= real_length + 5e9,
          f"{name}: recording spans {length / 1e9:.1f} s of a {real_length / 1e9:.1f} s run (no hour added or taken)")
    lo, hi = started - 1e9, ended + 1e9

    wins = rows(db, "SELECT start_ns, end_ns FROM windows WHERE recording_id = ? ORDER BY id", (rid,))
    check(len(wins) >= 4, f"{name}: {len(wins)} windows")
    bad = [(s, e) for s, e in wins if not (0 <= e - s <= MAX_WINDOW_NS)]
    check(not bad, f"{name}: no negative or giant window (lengths {[round((e - s) / 1e9, 1) for s, e in wins]})")
    check(all(wins[i + 1][0] >= wins[i][0] for i in range(len(wins) - 1)), f"{name}: windows in order")
    check(all(lo <= s and e <= hi for s, e in wins), f"{name}: windows inside the recording")

    for table, a, b in (("metrics", "start_ns", "end_ns"), ("steps", "start_ns", "end_ns"),
                        ("device_activity", "start_ns", "end_ns"), ("collectives", "enter_ns", "exit_ns"),
                        ("launch_samples", "start_ns", "end_ns")):
        n, out, neg = rows(db, f"SELECT COUNT(*), SUM({a} < ? OR {b} > ?), SUM({b} < {a}) FROM {table} "
                               f"WHERE recording_id = ?", (lo, hi, rid))[0]
        check(out in (0, None) and neg in (0, None),
              f"{name}: {table}: {n} rows, {out or 0} outside the recording, {neg or 0} ending before they start")
    pstart = rows(db, "SELECT pid, start_ns FROM processes WHERE recording_id = ? AND pid IN (%s)" %
                  ",".join(str(p) for p in truth), (rid,))
    check(len(pstart) == len(truth) and all(abs(s - started) < real_length + 60e9 for _, s in pstart),
          f"{name}: the ranks' process start times are on the timeline "
          f"({[round((s - started) / 1e9, 1) for _, s in pstart]} s from the start)")

    for pid, t in sorted(truth.items()):
        calls = rows(db, "SELECT seq, enter_ns FROM collectives WHERE recording_id = ? AND pid = ? ORDER BY seq",
                     (rid, pid))
        seqs = [s for s, _ in calls]
        check(seqs == list(range(1, t["collectives"] + 1)), f"{name}: rank {t['rank']}: collectives {seqs[0] if seqs else '-'}..{seqs[-1] if seqs else '-'} "
                  f"of {t['collectives']}, none missing")
        enters = [e for _, e in calls]
        check(all(enters[i + 1] >= enters[i] for i in range(len(enters) - 1)),
              f"{name}: rank {t['rank']}: collectives in call order on the timeline")
        n = rows(db, "SELECT COUNT(*) FROM steps WHERE recording_id = ? AND pid = ?", (rid, pid))[0][0]
        check(n == t["steps_done"], f"{name}: rank {t['rank']}: {n} steps of {t['steps_done']}")


def case_record(tmp):
    db = os.path.join(tmp, "record.db")
    truth = os.path.join(tmp, "record-truth.json")
    t0 = time.time_ns()
    p = subprocess.Popen([STRATA, "record", "-o", db, "--window", str(WINDOW_S), "--", SIM, "run", "--ranks", "2",
                          "--steps", "80", "--quiet", "--truth", truth],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=shim_env())
    out, err = p.communicate(timeout=300)
    t1 = time.time_ns()
    check(p.returncode == 0, f"record: exit {p.returncode}: {err[-2000:]}")
    check(f"clockjump: pid {p.pid}: wall clock +3600 s" in err and f"clockjump: pid {p.pid}: wall clock -7200 s" in err,
          "record: strata's own wall clock stepped +1 h and -2 h (shim)")
    if p.returncode != 0:
        return
    stats = dict(rows(db, "SELECT key, value FROM agent_stats"))
    check(stats.get("wall_clock_steps", 0) >= 2, f"record: the steps were noticed ({stats.get('wall_clock_steps')})")
    check(abs(stats.get("wall_clock_offset_s", 0) + 3600) < 60,
          f"record: the wall clock ended {stats.get('wall_clock_offset_s')} s from the timeline (-3600 expected)")
    stored = rows(db, "SELECT SUM(value) FROM stack_counts WHERE kind = 0")[0][0] or 0
    check(stored > 0 and stored == stats.get("samples_stored"),
          f"record: {stored} on-CPU samples in windows, {stats.get('samples_stored')} taken")
    check_store("record", db, t0, t1, read_truth(truth))


def case_agent(tmp):
    db = os.path.join(tmp, "agent.db")
    truth = os.path.join(tmp, "agent-truth.json")
    port = free_port()
    t0 = time.time_ns()
    agent = subprocess.Popen([STRATA, "agent", "-o", db, "--window", str(WINDOW_S), "--listen-metrics",
                              f"127.0.0.1:{port}", "--select", "STRATA_CLOCK_TEST=" + str(os.getpid())],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=shim_env())
    # The job starts from a shell that the agent finds first (it scans /proc every 2 s): the ranks
    # are then followed from their first instruction and every collective must be there.
    env = shim_env()
    env["STRATA_CLOCK_TEST"] = str(os.getpid())
    sim = subprocess.Popen(["sh", "-c", 'read go && exec "$0" "$@"', SIM, "run", "--ranks", "2", "--steps", "80",
                            "--quiet", "--truth", truth], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env)
    watched = None
    for _ in range(300):
        watched = metric(scrape(port), "strata_agent_watched_processes")
        if watched:
            break
        time.sleep(0.1)
    check(bool(watched), "agent: found the job's shell")
    out, err = sim.communicate("go\n", timeout=300)
    check(sim.returncode == 0, f"agent: the sim job ran: {err[-500:]}")
    time.sleep(2 * WINDOW_S + 1)
    page = scrape(port)
    steps = metric(page, "strata_agent_wall_clock_steps_total")
    offset = metric(page, "strata_agent_wall_clock_offset_seconds")
    check(steps is not None and steps >= 2, f"agent: /metrics counts the steps ({steps})")
    check(offset is not None and abs(offset + 3600) < 60, f"agent: /metrics offset {offset} s (-3600 expected)")
    agent.send_signal(signal.SIGTERM)
    out, err = agent.communicate(timeout=60)
    t1 = time.time_ns()
    check(agent.returncode == 0, f"agent: exit {agent.returncode}: {err[-2000:]}")
    check(f"clockjump: pid {agent.pid}: wall clock +3600 s" in err and
          f"clockjump: pid {agent.pid}: wall clock -7200 s" in err, "agent: its wall clock stepped +1 h and -2 h (shim)")
    check("the wall clock stepped" in err, "agent: says once that the wall clock stepped")
    if agent.returncode != 0 or sim.returncode != 0 or not watched:
        return
    m = re.search(r"strata: agent: \d+ window\(s\), \d+ process\(es\), (\d+) samples", err)
    taken = int(m.group(1)) if m else -1
    stored = rows(db, "SELECT SUM(value) FROM stack_counts WHERE kind = 0")[0][0] or 0
    check(stored > 0 and stored == taken, f"agent: {stored} on-CPU samples in windows, {taken} taken")
    check_store("agent", db, t0, t1, read_truth(truth))


def main():
    if os.geteuid() != 0:
        raise SystemExit("clock_jump_test needs root (BPF)")
    for f in (STRATA, SIM, SHIM):
        if not os.path.exists(f):
            raise SystemExit("missing " + f + " (build strata, strata-sim and strata_testprogs)")
    with tempfile.TemporaryDirectory(prefix="strata-clock-") as tmp:
        case_record(tmp)
        case_agent(tmp)
    if failures:
        print(f"{len(failures)} check(s) failed", flush=True)
        sys.exit(1)
    print("all clock-jump checks passed")


if __name__ == "__main__":
    main()
