#!/usr/bin/env bash
# 8 ranks x 200 steps of strata-sim on this machine: wall time and CPU used (issue: < 2 min, with
# CPU left over). usage: testbed/bench/sim_scale.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
start=$(date +%s.%N)
cpu0=$(awk '/^cpu /{print $2+$3+$4+$7+$8, $5}' /proc/stat)
"$build/bin/strata-sim" run --ranks 8 --steps 200 --quiet --truth /tmp/strata-sim-scale.json
end=$(date +%s.%N)
cpu1=$(awk '/^cpu /{print $2+$3+$4+$7+$8, $5}' /proc/stat)
read -r b0 i0 <<<"$cpu0"; read -r b1 i1 <<<"$cpu1"
wall=$(echo "$end - $start" | bc)
busy=$(echo "scale=1; 100 * ($b1 - $b0) / (($b1 - $b0) + ($i1 - $i0))" | bc)
echo "8 ranks x 200 steps: wall ${wall}s, machine CPU busy ${busy}% (all processes, 2 cores)"
python3 - <<'PY'
import json
t = json.load(open("/tmp/strata-sim-scale.json"))
s = [r["fault_window"]["step_ms"] for r in t["per_rank"]]
print("mean step_ms per rank: %s; spread %.1f%%" % (", ".join("%.0f" % x for x in s), 100 * (max(s) - min(s)) / max(s)))
PY
