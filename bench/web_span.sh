#!/usr/bin/env bash
# web_span.sh [BUILD_DIR] [--ranks N] [--short STEPS] [--long STEPS] [--runs K]: does a page's API
# read cost the same in a job's first ten minutes and long after? Two synthetic stores of one job
# (bench/web_store.cpp: N ranks, 0.2 s steps, one straggler) differ only in how long the job has
# run (default 3,000 steps = 10 minutes and 15,000 = 50 minutes, 100 ranks); `strata serve` serves
# each in turn, and the calls the job and timeline pages make without a span (the heatmap, a rank's
# timeline) are timed K times each (median), beside the heatmap of the job's whole history (what
# the page read before it had a span: `history`, an hour up to the latest step). Measured, not
# asserted: long/short is 1.0 where a read is bounded by its span. (The synthetic store keeps one
# stack window per rank, so the differential profile is not timed here.)
# Results: bench/results/web_span.txt.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
BUILD=$ROOT/build
RANKS=100
SHORT=3000
LONG=15000
RUNS=5
while [[ $# -gt 0 ]]; do
  case "$1" in
    --ranks) RANKS=$2; shift ;;
    --short) SHORT=$2; shift ;;
    --long) LONG=$2; shift ;;
    --runs) RUNS=$2; shift ;;
    -*) echo "web_span: unknown option $1" >&2; exit 1 ;;
    *) BUILD=$1 ;;
  esac
  shift
done
BUILD=$(cd "$BUILD" && pwd)
for f in "$BUILD/bin/strata" "$BUILD/bin/strata-web-bench-store"; do
  [[ -x $f ]] || { echo "web_span: $f is missing: build first (make build)" >&2; exit 1; }
done
WORK=$(mktemp -d /tmp/strata-web-span.XXXXXX)
SERVE_PID=
cleanup() { [[ -n $SERVE_PID ]] && kill "$SERVE_PID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
OUT=$ROOT/bench/results/web_span.txt
mkdir -p "$(dirname "$OUT")"
PORT=$((20000 + RANDOM % 20000))

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

for steps in "$SHORT" "$LONG"; do
  db=$WORK/job-$steps.db
  "$BUILD/bin/strata-web-bench-store" "$db" "$RANKS" "$steps" >/dev/null
  "$BUILD/bin/strata" serve --diagnose-every 0 --listen "127.0.0.1:$PORT" --store "sqlite:$db" >"$WORK/serve.log" 2>&1 &
  SERVE_PID=$!
  for _ in $(seq 100); do grep -q "serving on" "$WORK/serve.log" && break; sleep 0.1; done
  grep -q "serving on" "$WORK/serve.log" || { echo "web_span: strata serve did not start:" >&2; cat "$WORK/serve.log" >&2; exit 1; }
  base=http://127.0.0.1:$PORT/api/v1
  latest=$(curl -sf "$base/heatmap?series=none" | python3 -c 'import json,sys; print(json.load(sys.stdin)["to_ns"])')
  for call in "heatmap?series=step_ms" "timeline?rank=1" "history?series=step_ms&from=$((latest - 3600000000000))&to=$latest"; do
    name=${call%%\?*}
    call=${call/#history/heatmap}
    t=$(for _ in $(seq "$RUNS"); do
          curl -sf -o "$WORK/answer" -w '%{time_total}\n' "$base/$call" || { echo "web_span: $base/$call failed" >&2; exit 1; }
        done | median)
    printf '%-9s %6s steps: %7.3f s, %9d bytes\n' "$name" "$steps" "$t" "$(stat -c %s "$WORK/answer")" | tee -a "$WORK/lines"
  done
  kill "$SERVE_PID"; wait "$SERVE_PID" 2>/dev/null || true; SERVE_PID=
done
{
  echo "web_span: $RANKS ranks, 0.2 s steps; a job $SHORT steps old vs $LONG steps old; median of $RUNS calls; $(date -u +%FT%TZ)"
  cat "$WORK/lines"
  for name in heatmap timeline history; do
    s=$(awk -v n="$name" -v k="$SHORT" '$1==n && $2==k {print $4}' "$WORK/lines")
    l=$(awk -v n="$name" -v k="$LONG" '$1==n && $2==k {print $4}' "$WORK/lines")
    awk -v n="$name" -v s="$s" -v l="$l" 'BEGIN {printf "%-9s long/short %.2fx\n", n, (s > 0 ? l / s : 0)}'
  done
} | tee "$OUT"
