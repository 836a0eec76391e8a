#!/usr/bin/env bash
# cluster_scale.sh [BUILD_DIR] [--nodes N] [--ranks R] [--stores sqlite,clickhouse] [--faults K]
#                  [--kinds gpu-slow,...,hang] [--ages 1h,1d,1w] [--history-every SEC] [--fault-steps S] [--age-steps S]
# One `strata serve` collector on this machine under `strata-sim agents` (default 1,000 nodes x 8
# ranks), into SQLite and ClickHouse: ingest rate and collector CPU per 1,000 ranks, time from a
# fault's first step to the first correct finding (p90 over K faults), diagnosis round time as the job
# ages (1 hour / 1 day / 1 week of synthetic history), collector peak RSS. See bench/lib/cluster_scale.py.
# Targets: round time within 1.5x from 1 hour to 1 week; <= 20 s to a correct finding with 10 s
# windows at 8,000 ranks; RSS <= 2 GB. Results: bench/results/cluster_scale.{txt,json}.
# Time: paced with the wall clock: ~K minutes per store for the faults, plus the histories' ingest.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILD="$HERE/../build"
if [[ $# -gt 0 && "$1" != --* ]]; then BUILD=$1; shift; fi
BUILD=$(cd "$BUILD" && pwd)
for b in strata strata-sim; do
  [[ -x "$BUILD/bin/$b" ]] || { echo "cluster_scale.sh: $BUILD/bin/$b is missing (build it first)" >&2; exit 2; }
done
mkdir -p "$HERE/results"
# More open files than the default 1,024: a thousand agents' connections and spool files.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
python3 "$HERE/lib/cluster_scale.py" --build "$BUILD" --out "$HERE/results/cluster_scale.json" "$@" \
  2>&1 | tee "$HERE/results/cluster_scale.txt"
exit "${PIPESTATUS[0]}"
