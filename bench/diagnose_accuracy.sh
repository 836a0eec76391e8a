#!/bin/bash
# Accuracy of `strata diagnose` on every fault kind (old and new), per workload family: strata-sim
# with C++ ranks (cpp) and Python ranks (py), PyTorch DDP in the shapes the engine was looked at with
# (ddp) and in variants never tuned against (ddp-heldout: large model, hotspot in the loss or in a
# DataLoader worker, workers, pinning). Several seeds, healthy runs included. Prints one table per
# family: rank top-1, cause top-1, culprit named, false findings, time from the fault's start to the
# first correct finding with 10 s windows, and whether issue 17's targets are met. See bench/README.md.
#   sudo bench/diagnose_accuracy.sh [--quick] [--families cpp,py,ddp,ddp-heldout] [--ddp] [--kinds K,..]
#                                   [--seeds N] [--ranks 4,8] [--steps-4 N] [--steps-8 N] [--steps-ddp N]
#                                   [--build DIR] [--strata BIN] [--keep] [--list] [--run-timeout S]
#                                   [--summarize results.json [--rescore DIR]]
# --quick: 12 runs over every family, ~15 minutes on a quiet machine; the full matrix is hours.
# Needs root (strata record) and a quiet machine: another busy process slows the job for real.
# Results: bench/results/diagnose_accuracy/{summary.txt,results.json,runs.log}.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 bench/lib/diagnose_accuracy.py "$@"
