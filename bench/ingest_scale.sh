#!/usr/bin/env bash
# ingest_scale.sh [BUILD_DIR] [--nodes N] [--steps S] [--store SPEC] [--serve-args "..."]
# The collector's ingest at cluster scale: one fresh `strata serve` takes what `strata-sim agents`
# ships (default 1,000 nodes x 8 ranks, 20 steps of 10 s windows) as fast as it takes it
# (--speed 0). Prints rows/s acknowledged, the collector's CPU per row (steadier than rows/s on a
# shared machine), bytes it read and wrote per row (/proc/PID/io), send failures, and the load
# average before and after. --store: sqlite (a file in a temporary folder, the default) or a
# clickhouse://HOST:PORT/DB spec. --serve-args: more `strata serve` options (e.g.
# "--diagnose-every 0" for ingest alone). Results: bench/results/ingest_scale.txt (appended).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILD="$HERE/../build"
if [[ $# -gt 0 && "$1" != --* ]]; then BUILD=$1; shift; fi
BUILD=$(cd "$BUILD" && pwd)
NODES=1000 STEPS=20 STORE=sqlite SERVE_ARGS=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --nodes) NODES=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --store) STORE=$2; shift 2 ;;
    --serve-args) SERVE_ARGS=$2; shift 2 ;;
    *) echo "ingest_scale.sh: unknown option $1" >&2; exit 1 ;;
  esac
done
for b in strata strata-sim; do
  [[ -x "$BUILD/bin/$b" ]] || { echo "ingest_scale.sh: $BUILD/bin/$b is missing (build it first)" >&2; exit 2; }
done
TMP=$(mktemp -d /tmp/strata-ingest-scale.XXXXXX)
SP=""
cleanup() { [[ -n $SP ]] && kill "$SP" 2>/dev/null && wait "$SP" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
[[ $STORE == sqlite ]] && STORE="sqlite:$TMP/ingest.db"
# A thousand agents' connections and spool files need more than the default 1,024 open files.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# shellcheck disable=SC2086
"$BUILD/bin/strata" serve --store "$STORE" --listen "127.0.0.1:$PORT" $SERVE_ARGS > "$TMP/serve.log" 2>&1 &
SP=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PORT/metrics" >/dev/null && break; sleep 0.2; done
io() { awk '/^(rchar|wchar|syscr|syscw):/ {printf "%s ", $2}' "/proc/$SP/io"; }
cpu() { awk '{print $14 + $15}' "/proc/$SP/stat"; }
io0=$(io); c0=$(cpu); l0=$(cut -d' ' -f1 /proc/loadavg); t0=$(date +%s.%N)
rc=0
"$BUILD/bin/strata-sim" agents --server "http://127.0.0.1:$PORT" --nodes "$NODES" --ranks-per-node 8 --steps "$STEPS" \
  --speed 0 --job ingest-scale --truth "$TMP/truth.json" --quiet > "$TMP/sim.log" 2>&1 || rc=$?
t1=$(date +%s.%N); io1=$(io); c1=$(cpu); l1=$(cut -d' ' -f1 /proc/loadavg)
groups=$(curl -sf "http://127.0.0.1:$PORT/metrics" | awk '/^strata_serve_apply_groups_total / {print $2}')
mkdir -p "$HERE/results"
python3 - "$TMP/truth.json" "$t0" "$t1" "$c0" "$c1" "$l0" "$l1" "$io0" "$io1" "$rc" "$NODES" "$STEPS" "${groups:-0}" \
  "$(getconf CLK_TCK)" <<'PY' | tee -a "$HERE/results/ingest_scale.txt"
import json, sys, time
a = sys.argv
ship = json.load(open(a[1]))["shipping"]
t0, t1, c0, c1 = map(float, a[2:6])
rows = sum(ship["rows_acknowledged"].values())
cpu = (c1 - c0) / float(a[14])
d = [y - x for x, y in zip(map(int, a[8].split()), map(int, a[9].split()))]
batches = ship["batches_acknowledged"]
print("# bench/ingest_scale.sh %s: %s nodes x 8 ranks, %s steps; sim exit %s; load %s -> %s" %
      (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), a[11], a[12], a[10], a[6], a[7]))
print("  %d rows in %.1f s: %.0f rows/s; collector %.1f CPU-s: %.0f rows per CPU-second; send failures %d" %
      (rows, t1 - t0, rows / (t1 - t0), cpu, rows / max(cpu, 1e-9), ship["send_failures"]))
print("  per row: %.0f B read, %.0f B written (%.2f / %.2f calls); %d batches in %s store transactions" %
      (d[0] / rows, d[1] / rows, d[2] / rows, d[3] / rows, batches, a[13]))
PY
exit "$rc"
