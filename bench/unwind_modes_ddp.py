#!/usr/bin/env python3
"""Whole-stack share per user-stack unwinding mode on a real PyTorch DDP job (issue 15 item 3).

For each mode (STRATA_USER_STACK_MODE: 0 fp, 1 snapshot, 2 both -- the default --, 3 kcfi),
`strata record --layers cpu --budget 0 --window 5` watches testbed/workloads/ddp_train.py (Debian's
/usr/bin/python3 with python3-torch, 2 ranks over gloo) for STEPS steps, and the recording's on-CPU
samples are judged by tests/support/stack_wholeness.py (the rules ddp_unwind_test checks the default
mode by). Prints one line per mode: samples, whole share, and the main reasons the rest are not whole.
Usage: bench/unwind_modes_ddp.py BUILD_DIR [--steps N] [--modes 0,1,2,3]   (root)
"""
import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "support"))
from stack_wholeness import analyze  # noqa: E402

MODES = {0: "fp", 1: "snapshot", 2: "both", 3: "kcfi"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--modes", default="0,1,2,3")
    a = ap.parse_args()
    strata = os.path.join(os.path.abspath(a.build), "bin", "strata")
    workload = os.path.join(REPO, "testbed", "workloads", "ddp_train.py")
    print("%-9s %8s %7s  %s" % ("mode", "samples", "whole", "not whole (samples)"))
    for m in (int(x) for x in a.modes.split(",")):
        with tempfile.TemporaryDirectory(prefix="strata-unwind-modes-") as tmp:
            db = os.path.join(tmp, "r.db")
            env = dict(os.environ, STRATA_USER_STACK_MODE=str(m))
            rc = subprocess.run([strata, "record", "--window", "5", "--layers", "cpu", "--budget", "0", "-o", db, "--",
                                 "/usr/bin/python3", workload, "--ranks", "2", "--steps", str(a.steps)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, timeout=900).returncode
            if rc != 0:
                print("%-9s record exited %d" % (MODES[m], rc))
                continue
            r = analyze(db)
            why = ", ".join("%s %d" % kv for kv in sorted(r["why"].items(), key=lambda kv: -kv[1])[:4])
            print("%-9s %8d %7.3f  %s" % (MODES[m], r["samples"], r["share"], why), flush=True)


if __name__ == "__main__":
    main()
