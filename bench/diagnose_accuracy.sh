#!/bin/bash
# Accuracy of `strata diagnose` on the testbed's fault suite: every fault kind on random ranks with
# several seeds, plus healthy runs, 4 and 8 ranks, C++ and Python rank programs. Prints a table per
# kind (culprit rank top-1, cause top-1, culprit named, time from fault start to the first correct
# finding with 10 s windows) and the false findings on healthy runs.
#   sudo bench/diagnose_accuracy.sh [--quick] [--ddp] [--seeds N] [--ranks 4,8] [--langs cpp,py] [--kinds K,..]
#                                   [--steps-4 N] [--steps-8 N] [--build DIR] [--strata BIN] [--keep]
# --ddp: PyTorch DDP (gloo, CPU) under Debian's python3: host-hotspot, workload-imbalance, cpu-contention,
#   cpu-throttling, network-slow (its own netns + tbf) on a random rank + healthy runs (--quick: each once on 4 ranks + 2 healthy, ~8 minutes);
#   results in bench/results/diagnose_accuracy_ddp/.
# --quick: 11 runs (each kind once on 4 C++ ranks + 2 healthy), about 5 minutes.
# full: 3 seeds x {4,8} ranks x {C++,Python} x (9 kinds + healthy) = 120 runs, about 70 minutes.
# Needs root (strata record) and a quiet machine: another busy process slows the job for real.
# Results: bench/results/diagnose_accuracy/{summary.txt,results.json,runs.log}.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 bench/lib/diagnose_accuracy.py "$@"
