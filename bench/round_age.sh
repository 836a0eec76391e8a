#!/usr/bin/env bash
# round_age.sh [BUILD_DIR] [--quick]: does a diagnosis round cost more as the job ages? (issue 16)
# Synthetic stores of one job (bench/web_store.cpp: RANKS ranks, one straggler from half-way, 10 s
# windows of stacks and metrics as agents ship them) that ran 1x, 10x and 50x as many steps. For
# each: a collector's first round (`strata serve` on a copy of the store: the round's time and the
# rows it read, from /metrics), and `strata diagnose FILE.db --last 1m` (the round's span, with the
# minute before as the past: wall time, peak RSS; the default 10 minutes would be longer than the
# youngest store, whose ratio then says nothing). Printed as ratios to the youngest store; measured, not asserted (target: flat,
# within 1.5x). Results: bench/results/round_age.txt. Not part of the tests.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
BUILD=$ROOT/build
STEPS=(1000 10000 50000)
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) STEPS=(600 6000 30000) ;;
    -*) echo "round_age: unknown option $1" >&2; exit 1 ;;
    *) BUILD=$1 ;;
  esac
  shift
done
BUILD=$(cd "$BUILD" && pwd)
RANKS=${STRATA_ROUND_AGE_RANKS:-64}
for f in "$BUILD/bin/strata" "$BUILD/bin/strata-web-bench-store" /usr/bin/curl /usr/bin/time; do
  [[ -e "$f" ]] || { echo "round_age: missing $f" >&2; exit 2; }
done
WORK=$(mktemp -d /tmp/strata-round-age.XXXXXX)
SERVE_PID=
cleanup() { [[ -n "$SERVE_PID" ]] && kill "$SERVE_PID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
mkdir -p "$ROOT/bench/results"
OUT=$ROOT/bench/results/round_age.txt

metric() { curl -s "http://127.0.0.1:$1/metrics" | awk -v m="$2" '$1 == m { print $2 }'; }

rows=()
for steps in "${STEPS[@]}"; do
  db=$WORK/age-$steps.db
  "$BUILD/bin/strata-web-bench-store" "$db" "$RANKS" "$steps" 10 >/dev/null
  size_mb=$(( $(stat -c %s "$db") / 1048576 ))
  # strata diagnose FILE.db: the latest minute against the one before.
  /usr/bin/time -f "%e %M" -o "$WORK/time" "$BUILD/bin/strata" diagnose "$db" --last 1m --json >"$WORK/dx.json"
  read -r cli_s cli_kb <"$WORK/time"
  culprit=$(grep -o '"culprit":"[^"]*"' "$WORK/dx.json" | head -1 | cut -d'"' -f4)
  # A collector's first round over the same file (a copy: the collector writes its findings).
  cp "$db" "$WORK/serve.db"
  port=$(( 20000 + RANDOM % 20000 ))
  "$BUILD/bin/strata" serve --store "sqlite:$WORK/serve.db" --listen "127.0.0.1:$port" --diagnose-every 1 \
    2>"$WORK/serve.log" &
  SERVE_PID=$!
  for _ in $(seq 600); do
    kept=$(metric "$port" 'strata_serve_diagnoses_total{outcome="kept"}' || true)
    [[ "${kept:-0}" -ge 1 ]] && break
    sleep 0.2
  done
  round_s=$(metric "$port" strata_serve_diagnosis_seconds_total)
  round_rows=$(metric "$port" strata_serve_diagnosis_rows_read_total)
  kill "$SERVE_PID"; wait "$SERVE_PID" 2>/dev/null || true; SERVE_PID=
  rows+=("$steps $size_mb $round_s $round_rows $cli_s $cli_kb $culprit")
done

{
  echo "round_age: $RANKS ranks, straggler from half-way, 10 s windows ($(date -u +%FT%TZ), $(nproc) CPUs)"
  printf '%8s %8s %10s %10s %8s %8s %9s %10s %10s  %s\n' steps file_MB round_s round_rows round_x \
    rows_x diag_s diag_x diag_MB culprit
  read -r s0 _ r0 n0 c0 _ _ <<<"${rows[0]}"
  for row in "${rows[@]}"; do
    read -r steps mb rs rn cs ckb culprit <<<"$row"
    awk -v st="$steps" -v mb="$mb" -v rs="$rs" -v rn="$rn" -v cs="$cs" -v ckb="$ckb" -v r0="$r0" -v n0="$n0" \
        -v c0="$c0" -v cu="$culprit" 'BEGIN {
      printf "%8d %8d %10.3f %10d %8.2f %8.2f %9.2f %10.2f %10.0f  %s\n", st, mb, rs, rn, rs / r0, rn / n0, cs, cs / c0, ckb / 1024, cu }'
  done
} | tee "$OUT"
