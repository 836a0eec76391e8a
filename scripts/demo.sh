#!/usr/bin/env bash
# `make demo`: record the bundled CPU workload with strata and print what it found.
set -euo pipefail
BUILD=${1:-build}
OUT=${STRATA_DEMO_OUT:-out/demo}
STRATA="$BUILD/bin/strata"
mkdir -p "$OUT"
rm -f "$OUT/demo.db" "$OUT/demo.db-wal" "$OUT/demo.db-shm"

if [[ $(id -u) != 0 ]]; then
  echo "demo: strata record needs root (or CAP_BPF + CAP_PERFMON): run 'sudo make demo'" >&2
  exit 2
fi
mountpoint -q /sys/kernel/tracing 2>/dev/null || mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true

echo "== strata record -- cpu_workload 5   (99 Hz on-CPU sampling, user + kernel stacks)"
"$STRATA" record -F 99 -o "$OUT/demo.db" -- "$BUILD/testprogs/cpu_workload" 5
echo
echo "== strata report $OUT/demo.db"
"$STRATA" report "$OUT/demo.db" --format text
"$STRATA" report "$OUT/demo.db" --format folded -o "$OUT/demo.folded"
"$STRATA" report "$OUT/demo.db" --format pprof -o "$OUT/demo.pb.gz"
echo
echo "store:      $OUT/demo.db"
echo "folded:     $OUT/demo.folded   (flamegraph.pl $OUT/demo.folded > flame.svg)"
echo "pprof:      $OUT/demo.pb.gz    (go tool pprof -top $OUT/demo.pb.gz)"
