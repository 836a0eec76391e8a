#!/usr/bin/env python3
"""Peers by parallel role, end to end (label testbed; root: strata record).

`strata-sim run --pp 2 --tp 2` (stage 1 computes more than stage 0 by design) recorded by
`strata record`, then `strata diagnose`:
- the store holds every rank's communicators (world, its TP pair, its PP pair) with positions;
- the stages really differ (stage 1's GPUs compute longer), yet the healthy job has no finding;
- the web API's heatmap carries each rank's peer group (stage 0: ranks 0,1; stage 1: ranks 2,3), so
  the UI can compare a rank with its own stage;
- a gpu-slow fault on one rank of one stage is found on that rank, as gpu-slow;
- a layout that does not fit (ranks not a multiple of P x T, --python, --mode fsdp) exits 1, one line.
Usage: parallel_roles_test.py BUILD_DIR
"""
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
from harness import free_port, http, start, wait_http  # noqa: E402

B = os.path.abspath(sys.argv[1])
STRATA = os.path.join(B, "bin", "strata")
SIM = os.path.join(B, "bin", "strata-sim")
STEPS = 60          # ~25 s of job on a loaded 2-core machine
FAULT_STEP = 25     # enough healthy steps before the fault for a baseline
CULPRIT = 2         # stage 1, TP position 0
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def record(tmp, name, fault):
    db = os.path.join(tmp, name + ".db")
    truth = os.path.join(tmp, name + ".json")
    env = dict(os.environ)
    env["STRATA_NVML_LIBRARY"] = os.path.join(B, "testbed", "lib", "libnvidia-ml.so.1")
    cmd = [STRATA, "record", "--window", "5", "-o", db, "--",
           SIM, "run", "--pp", "2", "--tp", "2", "--steps", str(STEPS), "--fault", fault, "--truth", truth,
           "--quiet"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    check(p.returncode == 0, f"{name}: strata record + strata-sim exit 0 (rc {p.returncode}: {p.stderr[-400:]})")
    return db, truth


def diagnose(db):
    p = subprocess.run([STRATA, "diagnose", db, "--json"], capture_output=True, text=True, timeout=300)
    check(p.returncode == 0, f"strata diagnose exits 0 ({p.stderr.strip()[-300:]})")
    return json.loads(p.stdout) if p.returncode == 0 else {"findings": []}


def heatmap_groups(tmp, db):
    """Each rank's peer group as the web API's heatmap gives it ({rank: group}), from `strata serve`."""
    port = free_port()
    url = "http://127.0.0.1:%d" % port
    p = start([STRATA, "serve", "--store", "sqlite:" + db, "--listen", "127.0.0.1:%d" % port],
              os.path.join(tmp, "serve.log"))
    try:
        if not wait_http(url + "/metrics", 30):
            return {}
        status, body = http("GET", url + "/api/v1/heatmap?series=step_ms")
        return {r["rank"]: r.get("group") for r in json.loads(body)["ranks"]} if status == 200 else {}
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(30)


def interference(f):
    """A job-wide cpu-contention finding naming a process that is not the job's (a compiler run
    by someone else on this machine)."""
    return (f.get("scope") == "job" and f.get("cause") == "cpu-contention" and
            not f.get("culprit", "").startswith(("strata", "rank")))


def rows(db, sql):
    con = sqlite3.connect("file:" + db + "?mode=ro", uri=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def main():
    if os.geteuid() != 0:
        print("FAIL needs root (strata record)")
        return 1
    # Bad layouts: one line naming the option, exit 1, nothing started.
    for args, want in ((["--pp", "3", "--tp", "2", "--ranks", "8"], "multiple of --pp x --tp"),
                       (["--pp", "0"], "--pp 0"), (["--pp", "2", "--python"], "only the C++ rank"),
                       (["--tp", "2", "--mode", "fsdp"], "drop --mode")):
        p = subprocess.run([SIM, "run", "--steps", "3", *args], capture_output=True, text=True, timeout=30)
        err = p.stderr.strip()
        check(p.returncode == 1 and want in err and len(err.splitlines()) == 1,
              f"strata-sim run {' '.join(args)}: exit 1, one line ({p.returncode}: {err})")
    tmp = tempfile.mkdtemp(prefix="strata-roles-")
    db, truth_path = record(tmp, "healthy", "none")
    truth = json.load(open(truth_path))
    pids = {int(r): pid for r, pid in truth["pids"].items()}
    # Membership: 4 ranks x (world of 4, TP pair, PP pair).
    comms = rows(db, "SELECT pid, comm_id, rank, nranks FROM communicators")
    by_pid = {}
    for pid, cid, pos, size in comms:
        by_pid.setdefault(pid, []).append((cid, pos, size))
    check(all(len(by_pid.get(pids[r], [])) == 3 for r in range(4)),
          f"every rank's 3 communicators recorded ({ {r: len(by_pid.get(pids[r], [])) for r in range(4)} })")
    pp_pos = {}
    for r in range(4):
        for cid, pos, size in by_pid.get(pids[r], []):
            pp_pos.setdefault(cid, {})[r] = pos
    groups = sorted(tuple(sorted(m)) for cid, m in pp_pos.items() if len(m) == 2)
    check(groups == [(0, 1), (0, 2), (1, 3), (2, 3)], f"TP pairs (0,1),(2,3) and PP pairs (0,2),(1,3): {groups}")
    # Every rank's steps, stage 1's too (its microbatch runs were once taken for the step: 4 steps of 60).
    steps = {r: rows(db, f"SELECT COUNT(*) FROM steps WHERE pid = {pids[r]}")[0][0] for r in range(4)}
    check(all(steps[r] >= STEPS - 3 for r in range(4)), f"every rank's steps found ({steps} of {STEPS})")
    # The stages differ by design: stage 1's GPUs compute longer per step.
    dev = {r: rows(db, f"SELECT COALESCE(SUM(end_ns - start_ns), 0) FROM device_activity WHERE pid = {pids[r]} "
                       "AND kind = 'kernel'")[0][0] for r in range(4)}
    check(min(dev[2], dev[3]) > 1.6 * max(dev[0], dev[1]),
          f"stage 1 computes more than stage 0 by design (kernel ms: { {r: dev[r] // 1000000 for r in dev} })")
    groups = heatmap_groups(tmp, db)
    check(len(groups) == 4 and groups[0] == groups[1] and groups[2] == groups[3] and groups[0] != groups[2] and
          None not in groups.values(), f"heatmap: each rank's peer group is its stage ({groups})")
    dx = diagnose(db)
    # On a shared machine another process on the job's CPUs really slows it: a job-wide
    # cpu-contention finding that names a process outside the job is true, not a false finding
    # (the accuracy bench counts it apart the same way). Anything else on a healthy run is false.
    real = [f for f in dx["findings"] if interference(f)]
    if real:
        print(f"     interference found on the healthy run (true): {[f['culprit'] for f in real]}", flush=True)
    false = [f for f in dx["findings"] if not interference(f)]
    check(false == [], f"healthy pp=2 tp=2 job: no finding ({json.dumps(false)[:600]})")

    db, truth_path = record(tmp, "gpu-slow", f"gpu-slow:rank={CULPRIT},start_step={FAULT_STEP}")
    truth = json.load(open(truth_path))
    slow = [r["fault_window"]["step_ms"] for r in truth["per_rank"] if r.get("fault_window")]
    base = [r["baseline"]["step_ms"] for r in truth["per_rank"] if r.get("baseline")]
    print(f"     gpu-slow run: step {statistics.median(base):.0f} -> {statistics.median(slow):.0f} ms", flush=True)
    dx = diagnose(db)
    top = dx["findings"][0] if dx["findings"] else {}
    check(top.get("rank") == CULPRIT and top.get("cause") == "gpu-slow",
          f"gpu-slow on rank {CULPRIT} (stage 1) found: {json.dumps(dx['findings'])[:600]}")
    check(all(f.get("rank") == CULPRIT for f in dx["findings"]), "no other rank is blamed")
    if failures:
        print(f"     kept for a look: {tmp}", flush=True)
    else:
        subprocess.run(["rm", "-rf", tmp])
    print("FAILED: " + "; ".join(failures) if failures else "all ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
