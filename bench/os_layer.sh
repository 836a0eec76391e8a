#!/usr/bin/env bash
# os_layer.sh [--quick] [BUILD_DIR]
#
# What the OS layer (layers offcpu + os: bpf/offcpu.bpf.c on sched_switch, bpf/os.bpf.c, /proc and
# cgroup reads every window) costs the machine when sched_switch fires ~50k times a second.
# Workload: bench/os_pingpong.c, two threads on one CPU handing a byte over pipes, paced to
# BENCH_SWITCHES (50000) context switches/s. Three runs of SECS seconds each:
#   off        the workload alone
#   watched    strata record --layers offcpu,os -p <workload>: every switch is a watched thread's
#              (the worst case: task storage, counters, run-queue histogram on each switch)
#   bystander  strata record --layers offcpu,os -p <a sleeping process> while the workload runs
#              unwatched (the usual case on a busy node: most switches are not the job's)
# cost = (agent CPU + BPF run time of all of strata's programs) / (wall time x CPUs), from the
# recording's own accounting (agent_cpu_s, bpf_run_s, os_bpf_run_s: kernel BPF stats), beside the
# machine's measured context-switch rate (/proc/stat ctxt) and busy CPU share in each run.
# Target: cost <= 0.3% of the machine at 50k switches/s. Results: bench/results/os_layer.json.
# Needs root.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
QUICK=0
BUILD=""
for a in "$@"; do
  case $a in
    --quick) QUICK=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "os_layer: unknown option $a" >&2; exit 1 ;;
    *) BUILD=$a ;;
  esac
done
BUILD=${BUILD:-$ROOT/build}
[[ $BUILD == /* ]] || BUILD=$PWD/$BUILD
STRATA=$BUILD/bin/strata
SECS=${BENCH_SECS:-$((QUICK ? 5 : 15))}
RATE=${BENCH_SWITCHES:-50000}
RESULTS=${BENCH_RESULTS:-$HERE/results/os_layer.json}
[[ -x $STRATA ]] || { echo "os_layer: $STRATA not built" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "os_layer: needs root (BPF)" >&2; exit 2; }
NCPU=$(nproc)
WORK=$(mktemp -d /tmp/strata-bench-os.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cc -O2 -o "$WORK/os_pingpong" "$HERE/os_pingpong.c" -lpthread

# /proc/stat: "ctxt N" and the busy / total jiffies of the cpu line.
snap() { awk '/^cpu /{t=0; for(i=2;i<=NF;i++) t+=$i; printf "%d %d ", t-$5-$6, t} /^ctxt/{print $2}' /proc/stat; }

# run MODE: prints one JSON object.
run() {
  local mode=$1 rec="" pid sleeper="" out="$WORK/$1.db"
  rm -f "$out"
  taskset -c 0 "$WORK/os_pingpong" "$SECS" "$RATE" > "$WORK/$mode.out" &
  pid=$!
  sleep 0.5  # workload warmed up; the recording starts after
  if [[ $mode == watched ]]; then
    "$STRATA" record --layers offcpu,os -p "$pid" --duration $((SECS - 2)) -o "$out" 2> "$WORK/$mode.err" &
    rec=$!
  elif [[ $mode == bystander ]]; then
    sleep 1000 & sleeper=$!
    "$STRATA" record --layers offcpu,os -p "$sleeper" --duration $((SECS - 2)) -o "$out" 2> "$WORK/$mode.err" &
    rec=$!
  fi
  sleep 0.5
  read -r b0 t0 c0 < <(snap)
  local s0=$(date +%s.%N)
  sleep $((SECS - 3))
  read -r b1 t1 c1 < <(snap)
  local s1=$(date +%s.%N)
  [[ -n $rec ]] && wait "$rec"
  [[ -n $sleeper ]] && kill "$sleeper" && wait "$sleeper" 2>/dev/null || true
  wait "$pid"
  python3 - "$mode" "$out" "$b0" "$t0" "$c0" "$b1" "$t1" "$c1" "$s0" "$s1" "$NCPU" <<'PY'
import json, sqlite3, sys, os
mode, db = sys.argv[1], sys.argv[2]
b0, t0, c0, b1, t1, c1 = map(float, sys.argv[3:9])
s0, s1, ncpu = float(sys.argv[9]), float(sys.argv[10]), int(sys.argv[11])
r = {"mode": mode, "switches_per_s": round((c1 - c0) / (s1 - s0)), "machine_busy_pct": round(100 * (b1 - b0) / (t1 - t0), 2)}
if os.path.exists(db):
    con = sqlite3.connect(db)
    tables = [x[0] for x in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    st = {}
    for t in tables:
        cols = [c[1] for c in con.execute(f"PRAGMA table_info({t})")]
        if "key" in cols and "value" in cols and "stat" in t:
            st = dict(con.execute(f"SELECT key, value FROM {t}"))
    wall = st.get("wall_s", 0)
    agent, bpf = st.get("agent_cpu_s", 0), st.get("bpf_run_s", 0) + st.get("os_bpf_run_s", 0)
    r.update({"wall_s": round(wall, 2), "agent_cpu_ms": round(agent * 1e3, 1), "bpf_ms": round(bpf * 1e3, 1),
              "bpf_runs": int(st.get("os_bpf_runs", 0)),
              "cost_pct_of_machine": round(100 * (agent + bpf) / (wall * ncpu), 3) if wall else None,
              "offcpu_events": int(st.get("offcpu_events", 0)), "offcpu_captures": int(st.get("offcpu_captures", 0))})
print(json.dumps(r))
PY
}

echo "os_layer: ${SECS}s per run, target $RATE switches/s, $NCPU CPUs"
{
  echo "["
  run off; echo ","
  run watched; echo ","
  run bystander
  echo "]"
} > "$WORK/results.json"
mkdir -p "$(dirname "$RESULTS")"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); json.dump(d, open(sys.argv[2],"w"), indent=1); [print(json.dumps(x)) for x in d]' "$WORK/results.json" "$RESULTS"
