#!/usr/bin/env bash
# ingest.sh [BUILD_DIR] [--quick]: the cluster pipeline's costs (root).
#  1. the collector's ingest rate per core into SQLite and into ClickHouse (strata-ingest-bench:
#     decode + validate + apply of realistic batches on one thread; target >= 200k records/s/core)
#  2. bytes shipped per rank per second by `strata agent` on a steady 4-rank strata-sim job with
#     10 s windows (target <= 2 KB/s/rank), and the agent's RSS and CPU.
# Results: bench/results/ingest.txt
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILD=$(cd "${1:-$HERE/../build}" && pwd)
QUICK=0; [[ "${2:-}" == --quick ]] && QUICK=1
B=$BUILD/bin
TMP=$(mktemp -d /tmp/strata-ingest-bench.XXXXXX)
OUT=$HERE/results/ingest.txt
mkdir -p "$HERE/results"
pids=()
# Wait for what we started only: a bare `wait` would also wait for the tee below, which waits for us.
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done; rm -rf "$TMP"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Not a { ... } | tee pipeline: that would run the body in a subshell, out of reach of the trap.
exec > >(tee "$OUT") 2>&1
echo "# bench/ingest.sh $(date -u +%FT%TZ) on $(nproc) CPUs"
BATCHES=50; ((QUICK)) && BATCHES=10
"$B/strata-ingest-bench" "sqlite:$TMP/ingest.db" $BATCHES 20000

if [[ -x /usr/sbin/clickhouse-server ]]; then
  HP=$(free_port); TP=$(free_port); mkdir -p "$TMP/ch"
  cat > "$TMP/ch/config.xml" <<XML
<?xml version="1.0"?>
<yandex><logger><level>warning</level><log>$TMP/ch/server.log</log><errorlog>$TMP/ch/error.log</errorlog></logger>
<http_port>$HP</http_port><tcp_port>$TP</tcp_port><listen_host>127.0.0.1</listen_host>
<path>$TMP/ch/data/</path><tmp_path>$TMP/ch/tmp/</tmp_path><user_files_path>$TMP/ch/uf/</user_files_path>
<users_config>users.xml</users_config><default_profile>default</default_profile><default_database>default</default_database>
<mark_cache_size>104857600</mark_cache_size></yandex>
XML
  cp /etc/clickhouse-server/users.xml "$TMP/ch/"
  (cd "$TMP/ch" && exec /usr/sbin/clickhouse-server --config-file="$TMP/ch/config.xml" >/dev/null 2>&1) &
  pids+=($!)
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$HP/ping" >/dev/null && break; sleep 0.2; done
  # server_cpu_s is strata's side alone; ClickHouse's own CPU is on top (its process, other cores).
  "$B/strata-ingest-bench" "clickhouse://127.0.0.1:$HP/bench" $BATCHES 20000
else
  echo "clickhouse: not installed (scripts/install-deps.sh installs it)"
fi

# Steady job: bytes on the wire per rank per second.
PORT=$(free_port); MP=$(free_port)
"$B/strata" serve --store "sqlite:$TMP/server.db" --listen 127.0.0.1:$PORT > "$TMP/serve.log" 2>&1 &
pids+=($!)
sleep 0.5
"$B/strata" agent --server http://127.0.0.1:$PORT --node bench --window 10 --spool "$TMP/spool" \
  --listen-metrics 127.0.0.1:$MP > "$TMP/agent.log" 2>&1 &
AGENT=$!; pids+=($AGENT)
sleep 2
STEPS=800; ((QUICK)) && STEPS=300
start=$(date +%s.%N)
"$B/strata-sim" run --ranks 4 --steps $STEPS --quiet > "$TMP/sim.log" 2>&1
end=$(date +%s.%N)
sleep 11  # the last window
M=$(curl -s "http://127.0.0.1:$MP/metrics")
kill -TERM $AGENT; wait $AGENT || true
bytes=$(grep -o 'batches sent [0-9]*, pending [0-9]*, dropped [0-9]*, rejected [0-9]*, [0-9]* bytes' "$TMP/agent.log" | awk '{print $(NF-1)}')
secs=$(echo "$end - $start" | bc)
echo "steady job: 4 ranks, $secs s, $bytes bytes shipped (zstd) -> $(echo "scale=1; $bytes / 4 / $secs" | bc) B/s/rank"
echo "$M" | grep -E '^(process_resident_memory_bytes|process_cpu_seconds_total|strata_agent_samples_total|strata_agent_probe_hits_total) '
echo "agent CPU per second of job: $(echo "$M" | awk '/^process_cpu_seconds_total/{print $2}') s over $secs s"
grep "acked" "$TMP/agent.log" || true
