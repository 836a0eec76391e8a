#!/usr/bin/env python3
"""Hangs and Xids end to end (label testbed; root: strata record).

`strata-sim run` recorded by `strata record`, then `strata diagnose --json`:
- hang:rank=2 (the stand-in GPU stops): a hang finding on rank 2 whose evidence carries rank 2's
  last collective (op, communicator, sequence number), which ranks entered the call the job stopped
  in, and rank 2's stacks after the job's last progress;
- gpu-xid:rank=1,code=79 (the GPU falls off the bus): the stand-in NVML delivers Xid 79 through the
  event API, the store holds gpu.xid = 79 for gpu1 only, and the gpu-lost finding cites "Xid 79";
- gpu-xid:rank=3,code=48 (a double-bit ECC error): gpu.xid = 48 for gpu3, the gpu-memory-errors
  finding cites "Xid 48".
Usage: hang_xid_test.py BUILD_DIR
"""
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile

B = os.path.abspath(sys.argv[1])
STRATA = os.path.join(B, "bin", "strata")
SIM = os.path.join(B, "bin", "strata-sim")
RANKS = 4
STEPS = 60
FAULT_STEP = 15
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
    # A stand-in GPU state of the run's own: another strata-sim on this machine must not see (or
    # inject) this run's hardware faults.
    env["STRATA_TESTBED_DIR"] = os.path.join(tmp, "testbed-" + name)
    os.makedirs(env["STRATA_TESTBED_DIR"], exist_ok=True)
    # The hang timeout: past the engine's 10 s without progress, with windows of the stall alone.
    cmd = [STRATA, "record", "--window", "5", "-o", db, "--",
           SIM, "run", "--ranks", str(RANKS), "--steps", str(STEPS), "--fault", fault, "--truth", truth,
           "--hang-timeout", "20", "--quiet"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    check(p.returncode == 0, f"{name}: strata record + strata-sim exit 0 (rc {p.returncode}: {p.stderr[-400:]})")
    return db


def diagnose(db):
    p = subprocess.run([STRATA, "diagnose", db, "--json"], capture_output=True, text=True, timeout=300)
    check(p.returncode == 0, f"strata diagnose exits 0 ({p.stderr.strip()[-300:]})")
    return json.loads(p.stdout) if p.returncode == 0 else {"findings": []}


def rows(db, sql):
    con = sqlite3.connect("file:" + db + "?mode=ro", uri=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def finding(dx, cause):
    return next((f for f in dx["findings"] if f.get("cause") == cause), None)


def evidence_with(f, *parts):
    return next((e for e in (f or {}).get("evidence", []) if all(p in e for p in parts)), None)


def main():
    if os.geteuid() != 0:
        print("FAIL needs root (strata record)")
        return 1
    tmp = tempfile.mkdtemp(prefix="strata-hang-")

    db = record(tmp, "hang", f"hang:rank=2,start_step={FAULT_STEP}")
    dx = diagnose(db)
    f = finding(dx, "hang")
    shown = json.dumps(dx["findings"])[:1500]
    check(f is not None and f.get("rank") == 2, f"hang: a hang finding on rank 2 ({shown})")
    check(evidence_with(f, "rank 2's last collective: allreduce #", "on communicator ") is not None,
          "hang: rank 2's last collective (op, communicator, sequence number) in the evidence")
    check(evidence_with(f, "entered allreduce #") is not None or evidence_with(f, "never entered allreduce #") is not None,
          "hang: which ranks entered the call the job stopped in")
    # The calls the ranks were inside at their windows' ends (the agent's calls in flight): every
    # rank's host waits in cudaStreamSynchronize for the collective's stream, the stand-in GPU of
    # rank 2 having stopped.
    pids = dict(rows(db, "SELECT pid, rank FROM processes WHERE rank >= 0"))
    inflight = rows(db, "SELECT pid, label, MAX(value) FROM metrics WHERE name = 'comm.in_flight_s' GROUP BY pid, label")
    waiting = {pid for pid, label, v in inflight if label.startswith("cuda|cudaStreamSynchronize|") and v >= 10}
    check(len({pids[p] for p in waiting & set(pids)}) == RANKS,
          f"hang: the store holds ranks' cudaStreamSynchronize in flight for 10 s or more ({inflight}, ranks {pids})")
    check(evidence_with(f, "rank 2's host waits in cudaStreamSynchronize", "seen in flight") is not None,
          "hang: rank 2's host waiting in cudaStreamSynchronize (in flight) in the evidence")
    check(evidence_with(f, "rank 2 off-CPU", "since the job's last progress") is not None or
          evidence_with(f, "rank 2 on-CPU", "since the job's last progress") is not None,
          "hang: rank 2's stacks in the stall")

    db = record(tmp, "xid79", f"gpu-xid:rank=1,code=79,start_step={FAULT_STEP}")
    xids = rows(db, "SELECT label, value FROM metrics WHERE name = 'gpu.xid'")
    check(sorted(set(xids)) == [("gpu1", 79.0)], f"xid79: the store holds gpu.xid 79 for gpu1 only ({xids})")
    dx = diagnose(db)
    f = finding(dx, "gpu-lost")
    check(f is not None and f.get("rank") == 1 and evidence_with(f, "Xid 79", "gpu.xid") is not None,
          f"xid79: gpu-lost on rank 1 cites Xid 79 ({json.dumps(dx['findings'])[:1500]})")

    db = record(tmp, "xid48", f"gpu-xid:rank=3,code=48,start_step={FAULT_STEP}")
    xids = rows(db, "SELECT label, value FROM metrics WHERE name = 'gpu.xid'")
    check(sorted(set(xids)) == [("gpu3", 48.0)], f"xid48: the store holds gpu.xid 48 for gpu3 only ({xids})")
    dx = diagnose(db)
    f = finding(dx, "gpu-memory-errors")
    check(f is not None and f.get("rank") == 3 and evidence_with(f, "Xid 48", "gpu.xid") is not None,
          f"xid48: gpu-memory-errors on rank 3 cites Xid 48 ({json.dumps(dx['findings'])[:1500]})")

    shutil.rmtree(tmp, ignore_errors=True)
    print("FAILED: " + "; ".join(failures) if failures else "all ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
