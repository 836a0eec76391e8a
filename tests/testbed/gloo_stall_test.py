#!/usr/bin/env python3
"""The hang rule on a real PyTorch gloo job, end to end (label testbed; root: strata record).

`strata record --window 5` of tests/testprogs/gloo_stall.py (3 ranks, Debian's python3-torch), then
`strata diagnose --json`:
- teardown: every rank completes its last all-reduce, then stays alive 20 s outside every
  collective before it exits (a finished job's slow teardown: the measured false hang). No hang,
  no finding of any kind;
- hang: rank 1 stops before an all-reduce (sleeps 25 s in its own code), ranks 0 and 2 enter it and
  wait inside until killed. gloo records a call when it returns, so only the agent's calls in
  flight show it: the store holds comm.in_flight_s rows "gloo|allreduce||N" of ranks 0 and 2 for
  10 s or more, none of rank 1; the hang finding names rank 1 and says that ranks [0,2] are inside
  a collective and rank 1 inside none.
Usage: gloo_stall_test.py BUILD_DIR
"""
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
B = os.path.abspath(sys.argv[1])
STRATA = os.path.join(B, "bin", "strata")
PROG = os.path.join(os.path.dirname(HERE), "testprogs", "gloo_stall.py")
PYTHON = "/usr/bin/python3"  # Debian's, with python3-torch (scripts/install-deps.sh)
RANKS = 3
STEPS = 40
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def record(tmp, name, args):
    db = os.path.join(tmp, name + ".db")
    cmd = [STRATA, "record", "--window", "5", "-o", db, "--", PYTHON, PROG, "--ranks", str(RANKS), "--steps",
           str(STEPS)] + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    check(p.returncode == 0, f"{name}: strata record + gloo_stall.py exit 0 (rc {p.returncode}: {p.stderr[-600:]})")
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


def main():
    if os.geteuid() != 0:
        print("FAIL needs root (strata record)")
        return 1
    if subprocess.run([PYTHON, "-c", "import torch"], capture_output=True).returncode != 0:
        print("FAIL " + PYTHON + " cannot import torch: install python3-torch (scripts/install-deps.sh)")
        return 1
    tmp = tempfile.mkdtemp(prefix="strata-gloo-stall-")

    db = record(tmp, "teardown", ["--teardown-s", "20"])
    ranks = dict(rows(db, "SELECT pid, rank FROM processes WHERE rank >= 0"))
    last = rows(db, "SELECT MAX(exit_ns) FROM collectives")[0][0] or 0
    seen = rows(db, "SELECT MAX(end_ns) FROM metrics")[0][0] or 0
    check(len(set(ranks.values())) == RANKS and seen - last >= 15e9,
          f"teardown: {RANKS} ranks recorded, 15 s or more of windows after the last collective ({(seen - last) / 1e9:.1f} s)")
    dx = diagnose(db)
    check(not any(f.get("cause") == "hang" for f in dx["findings"]),
          f"teardown: no hang ({json.dumps(dx['findings'])[:1500]})")
    check(dx["findings"] == [], f"teardown: no finding at all ({json.dumps(dx['findings'])[:600]})")

    db = record(tmp, "hang", ["--hang-rank", "1", "--hang-s", "25"])
    ranks = dict(rows(db, "SELECT pid, rank FROM processes WHERE rank >= 0"))
    inflight = rows(db, "SELECT pid, label, MAX(value) FROM metrics WHERE name = 'comm.in_flight_s' GROUP BY pid, label")
    inside = {ranks[pid] for pid, label, v in inflight if pid in ranks and label.startswith("gloo|allreduce||") and v >= 10}
    check(inside == {0, 2}, f"hang: gloo allreduce in flight 10 s or more for ranks 0 and 2 only (got {sorted(inside)}: {inflight})")
    dx = diagnose(db)
    f = next((x for x in dx["findings"] if x.get("cause") == "hang"), None)
    shown = json.dumps(dx["findings"])[:1500]
    check(f is not None and f.get("rank") == 1, f"hang: a hang finding on rank 1 ({shown})")
    ev = (f or {}).get("evidence", [])
    check(any("ranks [0,2] are inside a collective (the longest: allreduce #" in e and
              "ranks [1] are inside none: they never entered it" in e for e in ev),
          "hang: ranks 0 and 2 inside the all-reduce, rank 1 inside none, in the evidence")

    if failures:
        print("kept for a look: " + tmp)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    print("FAILED: " + "; ".join(failures) if failures else "all ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
