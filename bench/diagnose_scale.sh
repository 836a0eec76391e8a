#!/bin/bash
# The diagnosis of one window at 1k / 10k / 100k ranks (synthetic window summaries with 4 planted
# faults on different layers): time on one core, peak memory, and whether every planted culprit is
# found in cost order. Target at 100k ranks: <= 5 s, <= 2 GB.
#   bench/diagnose_scale.sh [BUILD_DIR]      (default build/; needs target strata-diagnose-scale)
set -euo pipefail
build=${1:-build}
bin=$build/bin/strata-diagnose-scale
[ -x "$bin" ] || { echo "build $bin first: cmake --build $build --target strata-diagnose-scale" >&2; exit 1; }
printf '%-8s %12s %12s %12s %8s\n' ranks generate_s diagnose_s peak_rss_mb found
for n in 1000 10000 100000; do
  # One core, one process per size, so the peak RSS is this size's.
  line=$(taskset -c 0 "$bin" --ranks "$n") || { echo "FAILED at $n ranks: $line"; exit 1; }
  eval "$(echo "$line" | tr ' ' '\n' | grep '=' | sed 's/^/v_/')"
  printf '%-8s %12s %12s %12s %8s\n' "$v_ranks" "$v_generate_s" "$v_diagnose_s" "$v_peak_rss_mb" "$v_found"
done
