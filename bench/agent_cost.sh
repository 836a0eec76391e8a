#!/usr/bin/env bash
# agent_cost.sh [BUILD_DIR] [--quick] [--seconds S] [--workloads sim,ddp] [--uprobe-us US]: what the always-on
# `strata agent` costs the job it watches, by accounting, beside `strata record` and bpftrace's bare
# sampler on the same job at the same time, and the agent's peak RSS (issue 15, item 8). Each
# workload runs S seconds (default 600; --quick 60). bench/lib/agent_cost.py says how; results:
# bench/results/agent_cost.json. Needs root. Exit 1 when a target is missed.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
BUILD=$ROOT/build
ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) ARGS+=(--seconds 60) ;;
    --seconds | --workloads | --budget | --uprobe-us) ARGS+=("$1" "$2"); shift ;;
    -*) echo "agent_cost: unknown option $1 (--quick, --seconds S, --workloads sim,ddp, --budget PCT, --uprobe-us US)" >&2; exit 1 ;;
    *) BUILD=$1 ;;
  esac
  shift
done
BUILD=$(cd "$BUILD" && pwd)
for f in "$BUILD/bin/strata" "$BUILD/bin/strata-sim" /usr/bin/python3; do
  [[ -x "$f" ]] || { echo "agent_cost: missing $f (build first: make)" >&2; exit 2; }
done
# bpftrace's tracepoints (the floor's sched_switch) are read from tracefs, which a fresh machine may
# not have mounted (the agent itself attaches without it).
mountpoint -q /sys/kernel/tracing 2>/dev/null || mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
exec /usr/bin/python3 "$HERE/lib/agent_cost.py" "$BUILD" "${ARGS[@]}"
