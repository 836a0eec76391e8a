#!/usr/bin/env bash
# `make demo`: strata's main job end to end on one box. A 4-rank training-like job (the testbed's
# strata-sim: CUDA/NCCL stand-ins with the real ABI) runs with a fault on one rank; strata records
# every layer (CPU stacks, OS, GPU, collectives) into an SQLite store and says what made it slow.
set -euo pipefail
BUILD=${1:-build}
OUT=${STRATA_DEMO_OUT:-out/demo}
FAULT=${STRATA_DEMO_FAULT:-gpu-slow:rank=2}
STRATA="$BUILD/bin/strata"
mkdir -p "$OUT"
rm -f "$OUT"/demo.db "$OUT"/demo.db-wal "$OUT"/demo.db-shm

if [[ $(id -u) != 0 ]]; then
  echo "demo: strata record needs root (or CAP_BPF + CAP_PERFMON): run 'sudo make demo'" >&2
  exit 2
fi
mountpoint -q /sys/kernel/tracing 2>/dev/null || mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
# The testbed's NVML stand-in plays the node's GPUs (a real node has libnvidia-ml.so.1 already).
export STRATA_NVML_LIBRARY=${STRATA_NVML_LIBRARY:-$BUILD/testbed/lib/libnvidia-ml.so.1}

echo "== strata record -- strata-sim run --ranks 4 --steps 60 --fault $FAULT"
"$STRATA" record -o "$OUT/demo.db" -- \
  "$BUILD/bin/strata-sim" run --ranks 4 --steps 60 --fault "$FAULT" --truth "$OUT/truth.json"
echo
echo "== strata report $OUT/demo.db"
"$STRATA" report "$OUT/demo.db" --format text
echo
echo "== strata diagnose $OUT/demo.db"
"$STRATA" diagnose "$OUT/demo.db"
"$STRATA" diagnose "$OUT/demo.db" --json > "$OUT/diagnosis.json"
"$STRATA" report "$OUT/demo.db" --format folded -o "$OUT/demo.folded"
"$STRATA" report "$OUT/demo.db" --format pprof -o "$OUT/demo.pb.gz" 2>/dev/null
"$STRATA" report "$OUT/demo.db" --format chrome-trace -o "$OUT/trace.json" 2>/dev/null
echo
echo "injected:   $FAULT   (ground truth: $OUT/truth.json)"
echo "store:      $OUT/demo.db"
echo "diagnosis:  $OUT/diagnosis.json"
echo "folded:     $OUT/demo.folded   (flamegraph.pl $OUT/demo.folded > flame.svg)"
echo "pprof:      $OUT/demo.pb.gz    (go tool pprof -top $OUT/demo.pb.gz)"
echo "timeline:   $OUT/trace.json    (open in https://ui.perfetto.dev)"
echo
echo "To look at this recording in the browser, run this and open http://127.0.0.1:7878/ :"
echo
echo "  $STRATA serve --store sqlite:$OUT/demo.db"
