#!/usr/bin/env python3
"""Whole stacks on a real PyTorch DDP job (label bpf; root; issue 15 item 3).

`strata record` (default unwinding mode, 5 s windows, 99 Hz, --budget 0) watches
testbed/workloads/ddp_train.py under Debian's /usr/bin/python3 with python3-torch: 2 ranks over
gloo, whose libraries (python3, libtorch, libgloo, OpenBLAS) keep no frame pointers. Checked on
the recording's on-CPU samples (tests/support/stack_wholeness.py says what whole means):
- no sample is one address repeated (a frame-pointer walk looping through the heap);
- no sample has a frame without a module between two frames with one (a walk through garbage);
- at least WHOLE_SHARE_MIN of the samples are whole (reach _start / a thread's start).
The budget is off (--budget 0): whether it steps down depends on how loaded the machine is, and
what is tested here is the unwinding; the budget's order (rate first, CFI off last) is unit-tested.
Usage: ddp_unwind_test.py BUILD_DIR
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "support"))
from harness import check, failures  # noqa: E402
from stack_wholeness import analyze, describe  # noqa: E402

B = os.path.abspath(sys.argv[1])
STRATA = os.path.join(B, "bin", "strata")
REPO = os.path.dirname(os.path.dirname(HERE))
WORKLOAD = os.path.join(REPO, "testbed", "workloads", "ddp_train.py")
PYTHON = "/usr/bin/python3"  # Debian's, with python3-torch (scripts/install-deps.sh)
# What is not whole on this job, measured (issue 15 note): stacks deeper than the 24 KiB stack copy
# or than 127 native frames (torch's nested imports), a leaf in a library mapped an instant before
# its maps were read, OpenBLAS's assembly kernels (no CFI): 8% of samples (0.918 and 0.923 whole in
# two runs). Before the fixes 0.25-0.33 were whole; 0.85 leaves room for a run's spread and fails
# on any broken walk.
WHOLE_SHARE_MIN = 0.85
# Enough samples that the share means something (about 10 s of CPU at 99 Hz gives ~1000).
MIN_SAMPLES = 200
STEPS = 20


def main():
    if os.geteuid() != 0:
        raise SystemExit("ddp_unwind_test needs root (BPF)")
    if not os.path.exists(STRATA):
        raise SystemExit("missing " + STRATA + " (build strata)")
    if subprocess.run([PYTHON, "-c", "import torch"], capture_output=True).returncode != 0:
        raise SystemExit(PYTHON + " cannot import torch: install python3-torch (scripts/install-deps.sh)")
    with tempfile.TemporaryDirectory(prefix="strata-ddp-unwind-") as tmp:
        db = os.path.join(tmp, "ddp.db")
        log = os.path.join(tmp, "record.log")
        env = dict(os.environ)
        env.pop("STRATA_USER_STACK_MODE", None)  # the default mode is what is tested
        with open(log, "w") as out:
            rc = subprocess.run([STRATA, "record", "--window", "5", "--layers", "cpu", "--budget", "0", "-o", db, "--",
                                 PYTHON, WORKLOAD, "--ranks", "2", "--steps", str(STEPS)],
                                stdout=out, stderr=subprocess.STDOUT, env=env, timeout=600).returncode
        print(open(log).read()[-1500:])
        check(rc == 0, "strata record of the DDP job exits 0 (got %d)" % rc)
        r = analyze(db)
        print("samples %d, whole %d (%.3f); not whole: %s" % (r["samples"], r["whole"], r["share"], r["why"]))
        for n, reason, sid in r["broken"][:8]:
            print("  %5d %-22s %s" % (n, reason, describe(r["stacks"][sid])[:300]))
        check(r["samples"] >= MIN_SAMPLES, "at least %d on-CPU samples (%d)" % (MIN_SAMPLES, r["samples"]))
        check(r["why"].get("repeated-address", 0) == 0,
              "no sample is one address repeated (%d)" % r["why"].get("repeated-address", 0))
        check(r["why"].get("unknown-between-known", 0) == 0,
              "no [unknown] frame between two known ones (%d)" % r["why"].get("unknown-between-known", 0))
        check(r["share"] >= WHOLE_SHARE_MIN,
              "whole-stack share %.3f >= %.2f" % (r["share"], WHOLE_SHARE_MIN))
    if failures:
        print("FAILED: %d check(s)" % len(failures))
        return 1
    print("PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
