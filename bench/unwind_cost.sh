#!/bin/sh
# Cost per sample of each user-stack method, side by side on the same workloads: the kernel's
# frame-pointer walk (fp), the stack copy unwound on the node with CFI (snapshot), both, and the
# CFI walk in the kernel from compact tables the node derives (kcfi, STRATA_USER_STACK_MODE=3).
# Per method: BPF run time per sample (kernel BPF stats of the sampling program alone: the
# fork/exec/exit programs run for every process on the node), node time per sample (unwinding without
# the one-time table build), the one-time table build (+ load into the kernel for kcfi), table
# memory (node cache; kernel rows + page index), the share of walks that reached the outermost frame, and the
# agent's CPU share of the target's. Last, kernel table bytes per MB of .eh_frame.
# Usage: bench/unwind_cost.sh [BUILD_DIR] [SECONDS]   (root)
set -eu
B=${1:-build}; S=${2:-5}; T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
SRC=$(cd "$(dirname "$0")/.." && pwd); ratio=""
stat() { v=$(sqlite3 "$1" "select value from agent_stats where key='$2'"); echo "${v:-0}"; }
printf '%-11s %-8s %7s %9s %9s %9s %9s %9s %8s %7s\n' \
  workload mode samples bpf_us/smp node_us/smp build_ms node_KB kern_KB complete agent%
for w in nofp_chain py_chain; do
  for mode in 0 1 2 3; do
    case $w in
      nofp_chain) cmd="$B/testprogs/nofp_chain $S" ;;
      py_chain) cmd="/usr/bin/python3.11 $SRC/tests/testprogs/py_chain.py $S" ;;
    esac
    rm -f "$T/r.db"
    STRATA_USER_STACK_MODE=$mode "$B/bin/strata" record --layers cpu -o "$T/r.db" -- $cmd >/dev/null 2>&1
    n=$(stat "$T/r.db" samples); bpf=$(stat "$T/r.db" bpf_sample_run_s); node=$(stat "$T/r.db" unwind_walk_s)
    build=$(stat "$T/r.db" unwind_table_build_s); kload=$(stat "$T/r.db" unwind_kernel_table_s)
    tb=$(stat "$T/r.db" unwind_table_peak_bytes)
    kb=$(( $(stat "$T/r.db" unwind_kernel_table_bytes | cut -d. -f1) + $(stat "$T/r.db" kcfi_page_index_bytes | cut -d. -f1) ))
    a=$(stat "$T/r.db" agent_cpu_s); tc=$(stat "$T/r.db" target_cpu_s)
    case $mode in
      1|2) walks=$(stat "$T/r.db" unwind_snapshot_samples); done_=$(stat "$T/r.db" unwind_snapshot_complete) ;;
      3) walks=$(stat "$T/r.db" unwind_kernel_walks); done_=$(stat "$T/r.db" unwind_kernel_complete)
         kcfi_rows=$(stat "$T/r.db" unwind_kernel_rows); kcfi_cfi=$(stat "$T/r.db" unwind_kernel_cfi_bytes)
         kcfi_mods=$(stat "$T/r.db" unwind_kernel_modules)
         ratio="$ratio $w: $kcfi_mods modules, $kcfi_rows rows = $kb B of kernel table for $kcfi_cfi B of CFI;" ;;
      *) walks=0; done_=0 ;;
    esac
    name=$(echo "fp snapshot both kcfi" | cut -d' ' -f$((mode + 1)))
    awk -v w=$w -v m=$name -v n=$n -v b=$bpf -v no=$node -v bu=$build -v kl=$kload -v tb=$tb -v kb=$kb \
        -v a=$a -v tc=$tc -v wk=$walks -v d=$done_ -v mode=$mode 'BEGIN {
      once = bu + kl  # tables built (+ for kcfi loaded into the kernel): once per module
      c = wk > 0 ? sprintf("%.1f%%", 100 * d / wk) : "-"
      printf "%-11s %-8s %7d %9.1f %9.1f %9.1f %9.0f %9.0f %8s %7.3f\n", w, m, n, b*1e6/n, no*1e6/n,
        once*1e3, tb/1024, kb/1024, c, 100*(a+b)/tc }'
  done
done
echo "kcfi table size:$ratio" | awk '{ print }'
# Bytes of kernel table per MB of CFI, per workload (12-byte rows, rows repeat only where a rule changes).
echo "$ratio" | tr ';' '\n' | awk '/rows/ { for (i = 1; i <= NF; i++) { if ($(i) == "B" && $(i+1) == "of" && $(i+2) == "kernel") kb = $(i-1); if ($(i) == "B" && $(i+1) == "of" && $(i+2) == "CFI") cb = $(i-1) } if (cb > 0) printf "  %s kernel table bytes per MB of .eh_frame: %.2f MB/MB\n", $1, kb / cb }'
cat <<'NOTE'
Choice per module kind (bench/README.md has the measured table and the reasons):
  modules with frame pointers: frame pointers in every mode (no tables; cheapest).
  modules without: kcfi and snapshot cost about the same per sample all told (BPF + node);
  the snapshot is whole from a process's first sample and after dlopen (the node re-reads the
  maps), kcfi only once the agent has loaded the tables (see 'complete'). Default stays 'both' (2);
  kcfi (3) where 4-16 KB stack copies per sample are the bottleneck (ring buffer, node CPU).
NOTE
