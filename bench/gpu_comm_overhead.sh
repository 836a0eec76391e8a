#!/usr/bin/env bash
# bench/gpu_comm_overhead.sh [BUILD_DIR] [--quick]
# Cost of the GPU + communication layers (issue: GPU/comm layers, item 4), side by side in one run:
#  1. cost of one probed API call: cudaSetDevice in a loop, plain vs probed (entry + return uprobe),
#     interleaved A/B/B/A, median of rounds;
#  2. the sim (4 ranks, DDP-like) under `strata record --layers cpu` vs `--layers cpu,gpu,comm`:
#     probe hits x measured cost + BPF run time, per rank per step, over the step time;
#  3. adaptive launch sampling as the launch rate grows 10x (--scale 1 vs 0.1): launch hits/s and
#     the launch probes' share of one CPU stay under the budget (0.05% of a CPU by default).
# Results: bench/results/gpu_comm_overhead.json.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILD=build
QUICK=0
for a in "$@"; do
  case $a in
    --quick) QUICK=1 ;;
    *) BUILD=$a ;;
  esac
done
BUILD=$(cd "$BUILD" && pwd)
STRATA=$BUILD/bin/strata
SIM=$BUILD/bin/strata-sim
LIB=$BUILD/testbed/lib/libcudart.so.13
[[ -x $STRATA && -x $SIM && -f $LIB ]] || { echo "gpu_comm_overhead: build first (make build): need $STRATA, $SIM, $LIB" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "gpu_comm_overhead: needs root (BPF)" >&2; exit 2; }
TMP=$(mktemp -d /tmp/strata-bench-gc.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$HERE/results"
cc -O2 -o "$TMP/probe_loop" "$HERE/probe_loop.c" -ldl

N=200000; ROUNDS=3; STEPS=40
if ((QUICK)); then N=50000; ROUNDS=2; STEPS=20; fi

echo "1. cost of a probed call (cudaSetDevice, entry + return uprobe), $N calls, $ROUNDS rounds A/B/B/A"
: > "$TMP/probe.txt"
for ((r = 0; r < ROUNDS; r++)); do
  a1=$("$TMP/probe_loop" "$LIB" "$N")
  b1=$("$STRATA" record --layers gpu -o "$TMP/p$r.db" -- "$TMP/probe_loop" "$LIB" "$N" 2>/dev/null)
  b2=$("$STRATA" record --layers gpu -o "$TMP/q$r.db" -- "$TMP/probe_loop" "$LIB" "$N" 2>/dev/null)
  a2=$("$TMP/probe_loop" "$LIB" "$N")
  echo "$a1 $b1 $b2 $a2" >> "$TMP/probe.txt"
  echo "   round $r: plain $a1 / probed $b1 $b2 / plain $a2 ns per call"
done

echo "2. the sim, 4 ranks x $STEPS steps: --layers cpu vs cpu,gpu,comm"
for layers in cpu cpu,gpu,comm; do
  "$STRATA" record --layers "$layers" -o "$TMP/sim-$layers.db" -- \
    "$SIM" run --ranks 4 --steps "$STEPS" --truth "$TMP/truth-$layers.json" --quiet > /dev/null 2> "$TMP/sim-$layers.log"
done

echo "3. adaptive launch sampling: --scale 1 vs 0.1 (10x the launch rate)"
for scale in 1 0.1; do
  "$STRATA" record --layers gpu,comm -o "$TMP/scale-$scale.db" -- \
    "$SIM" run --ranks 2 --steps $((STEPS * 2)) --scale "$scale" --truth "$TMP/truth-scale-$scale.json" --quiet \
    > /dev/null 2> "$TMP/scale-$scale.log"
done

python3 - "$TMP" "$HERE/results/gpu_comm_overhead.json" <<'PY'
import json, sqlite3, statistics, sys
tmp, out = sys.argv[1], sys.argv[2]

def stats(db):
    c = sqlite3.connect(db)
    return dict(c.execute("SELECT key, value FROM agent_stats"))

rounds = [list(map(float, l.split())) for l in open(tmp + "/probe.txt")]
per_call = [((b1 + b2) / 2 - (a1 + a2) / 2) for a1, b1, b2, a2 in rounds]
cost_ns = statistics.median(per_call)          # entry + return
hit_us = max(cost_ns / 2 / 1000, 0.0)          # one uprobe hit
print("   probed call costs %.0f ns more (median of %d rounds): %.2f us per uprobe hit" % (cost_ns, len(rounds), hit_us))

def sim_cost(layers):
    s = stats("%s/sim-%s.db" % (tmp, layers))
    t = json.load(open("%s/truth-%s.json" % (tmp, layers)))
    steps = sum(r["steps_done"] for r in t["per_rank"])
    step_ms = statistics.mean(statistics.mean(r["step_ms"][1:] or r["step_ms"]) for r in t["per_rank"])
    hits = s.get("gpu_comm.probe_entries", 0) + s.get("gpu_comm.probe_returns", 0)
    bpf = s.get("gpu_comm.bpf_run_s", 0)
    per_step_ms = (hits * hit_us / 1e6 + bpf) / steps * 1e3 if steps else 0
    return dict(layers=layers, steps=steps, step_ms=step_ms, probe_hits=hits, launch_hits=s.get("gpu_comm.launch_hits", 0),
                bpf_s=bpf, cost_per_rank_step_ms=per_step_ms,
                share_of_step_pct=100 * per_step_ms / step_ms if step_ms else 0,
                agent_cpu_s=s.get("agent_cpu_s", 0), target_cpu_s=s.get("target_cpu_s", 0))

base, full = sim_cost("cpu"), sim_cost("cpu,gpu,comm")
print("   step time %.1f ms; gpu+comm probes: %d hits, BPF %.1f ms -> %.3f ms per rank per step = %.3f%% of step time"
      % (full["step_ms"], full["probe_hits"], full["bpf_s"] * 1e3, full["cost_per_rank_step_ms"], full["share_of_step_pct"]))
print("   agent CPU: %.0f ms with cpu only, %.0f ms with all layers (targets: %.1f s / %.1f s CPU)"
      % (base["agent_cpu_s"] * 1e3, full["agent_cpu_s"] * 1e3, base["target_cpu_s"], full["target_cpu_s"]))

adaptive = []
for scale in ("1", "0.1"):
    s = stats("%s/scale-%s.db" % (tmp, scale))
    c = sqlite3.connect("%s/scale-%s.db" % (tmp, scale))
    kernels = c.execute("SELECT COUNT(*) FROM device_activity WHERE kind='kernel'").fetchone()[0]
    wall = s.get("wall_s", 1)
    hits = s.get("gpu_comm.launch_hits", 0)
    a = dict(scale=scale, launches_per_s=kernels / wall, bursts=s.get("gpu_comm.launch_bursts", 0),
             launch_hits=hits, launch_hits_per_s=hits / wall,
             launch_probe_cpu_pct=100 * hits * 2 * hit_us / 1e6 / wall)
    adaptive.append(a)
    print("   scale %-4s %7.0f launches/s, %d bursts, %5.1f sampled launches/s -> launch probes %.4f%% of one CPU"
          % (scale, a["launches_per_s"], a["bursts"], a["launch_hits_per_s"], a["launch_probe_cpu_pct"]))
json.dump(dict(probe_hit_us=hit_us, probe_rounds=rounds, sim=[base, full], adaptive=adaptive), open(out, "w"), indent=1)
print("   -> " + out)
PY
