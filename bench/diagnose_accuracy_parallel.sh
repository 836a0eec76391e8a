#!/bin/bash
# Accuracy of `strata diagnose` on pipeline/tensor-parallel testbed jobs (`strata-sim run --pp P --tp T`):
# healthy runs and gpu-slow / host-hotspot / workload-imbalance on one rank of one stage, at pp=2 tp=2
# (4 ranks), pp=2 tp=2 dp=2 and pp=4 tp=2 (8 ranks). A list of its own beside diagnose_accuracy.sh's.
#   sudo bench/diagnose_accuracy_parallel.sh [--quick] [--seeds N] [--build DIR] [--strata BIN] [--keep]
# --quick: one seed, 4 ranks (4 runs, ~4 minutes); full: 3 seeds x 3 layouts x 4 kinds = 36 runs (~45 minutes).
# Needs root (strata record) and a quiet machine. Results: bench/results/diagnose_accuracy_parallel/.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 bench/lib/diagnose_accuracy_parallel.py "$@"
