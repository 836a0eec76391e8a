#!/usr/bin/env bash
# run-all.sh [BUILD_DIR] [--quick]: runs every benchmark in bench/ (each bench/*.sh but this one),
# one after the other; `make bench` calls it. Results go to bench/results/.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rc=0
for b in "$HERE"/*.sh; do
  [[ $(basename "$b") == run-all.sh ]] && continue
  [[ $(basename "$b") == gpu-check.sh ]] && { echo "== bench/gpu-check.sh: skipped (needs a real GPU; run it by hand there)"; continue; }
  echo "== bench/$(basename "$b") $*"
  bash "$b" "$@" || { echo "run-all: bench/$(basename "$b") failed" >&2; rc=1; }
done
exit $rc
