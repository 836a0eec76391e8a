#!/usr/bin/env bash
# switch_cost.sh BUILD_A BUILD_B [--seconds S] [--warmup W] [--rounds N]: the agent's BPF ns a run per
# program (on_switch above all) for two builds watching one sim job at the same time, so both see the
# same switches under the same load (issue 15). bench/lib/switch_cost.py says how. Needs root.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[[ $# -ge 2 ]] || { echo "usage: switch_cost.sh BUILD_A BUILD_B [--seconds S] [--warmup W] [--rounds N] [--args-a ARGS] [--args-b ARGS]" >&2; exit 2; }
for b in "$1" "$2"; do
  for f in bin/strata bin/strata-sim bin/strata-sim-rank; do
    [[ -x "$b/$f" ]] || { echo "switch_cost: missing $b/$f" >&2; exit 2; }
  done
done
exec /usr/bin/python3 "$HERE/lib/switch_cost.py" "$@"
