#!/bin/sh
# Cost per sample of each user-stack method (kernel BPF run time from BPF stats + node-side unwind
# time), unwind table memory, and the agent's CPU share, on the unwinding test programs.
# Usage: bench/unwind_cost.sh [BUILD_DIR] [SECONDS]   (root)
set -eu
B=${1:-build}; S=${2:-5}; T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
SRC=$(cd "$(dirname "$0")/.." && pwd)
stat() { sqlite3 "$1" "select value from agent_stats where key='$2'"; }
printf '%-14s %-9s %8s %10s %10s %10s %9s\n' workload mode samples bpf_us/smp node_us/smp table_MB agent%
for w in nofp_chain py_chain; do
  for mode in 0 1 2; do
    case $w in
      nofp_chain) cmd="$B/testprogs/nofp_chain $S" ;;
      py_chain) cmd="/usr/bin/python3.11 $SRC/tests/testprogs/py_chain.py $S" ;;
    esac
    rm -f "$T/r.db"
    STRATA_USER_STACK_MODE=$mode "$B/bin/strata" record --layers cpu -o "$T/r.db" -- $cmd >/dev/null 2>&1
    n=$(stat "$T/r.db" samples); bpf=$(stat "$T/r.db" bpf_run_s); node=$(stat "$T/r.db" unwind_node_s)
    tb=$(stat "$T/r.db" unwind_table_bytes); a=$(stat "$T/r.db" agent_cpu_s); tc=$(stat "$T/r.db" target_cpu_s)
    name=$(echo "fp snapshot both" | cut -d' ' -f$((mode + 1)))
    awk -v w=$w -v m=$name -v n=$n -v b=$bpf -v no=$node -v tb=$tb -v a=$a -v tc=$tc 'BEGIN {
      printf "%-14s %-9s %8d %10.1f %10.1f %10.2f %9.3f\n", w, m, n, b*1e6/n, no*1e6/n, tb/1048576, 100*(a+b)/tc }'
  done
done
