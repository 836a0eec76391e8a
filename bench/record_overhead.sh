#!/usr/bin/env bash
# record_overhead.sh [--quick] [BUILD_DIR]
#
# What `strata record` costs a CPU-bound job at 99 Hz, beside `perf record -F 99 -g` and bpftrace's
# `profile:hz:99 /pid == X/ { @[ustack] = count(); }`. See bench/README.md.
#
#  1. Accounting (the figure that counts): a fixed-time job (tests/testprogs/cpu_workload.c, one thread, frame
#     pointers) runs while each profiler is attached to it by pid. Between the moment the job starts
#     its work and the moment it finishes, we read the profiler's own CPU time (sum of
#     /proc/PID/task/*/schedstat, ns) and the run time of the BPF programs it holds (run_time_ns /
#     run_cnt from /proc/PID/fdinfo, the counters `bpftool prog show` prints; kernel.bpf_stats_enabled
#     is 1 meanwhile). cost = (profiler CPU + BPF run time) / the job's CPU time.
#     Start-up and teardown fall outside that window; they are reported apart, from wait4.
#  2. Sanity check: short fixed-work runs interleaved plain/profiled/profiled/plain for a few rounds;
#     the median over rounds of (profiled wall time / plain wall time).
#
# Default ~5 minutes (accounting at 10 s and 30 s, 3 A/B rounds of ~2 s runs); --quick ~1 minute.
# Environment overrides: BENCH_ACCT_DURS="10 30", BENCH_AB_ROUNDS=3, BENCH_AB_SECS=2,
# BENCH_PROFILERS="strata perf bpftrace", BENCH_RESULTS=bench/results/record_overhead.json,
# BENCH_STRATA_REV (a label for the strata measured, when its build has no git tree).
# Needs root. Sampling stays at 99 Hz (never more than 1 kHz on these machines).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
HZ=99

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
}

QUICK=0
BUILD=""
for a in "$@"; do
  case $a in
    --quick) QUICK=1 ;;
    -h | --help)
      usage
      exit 0
      ;;
    -*)
      echo "record_overhead: unknown option $a" >&2
      exit 1
      ;;
    *) BUILD=$a ;;
  esac
done
BUILD=${BUILD:-$ROOT/build}
[[ $BUILD == /* ]] || BUILD=$PWD/$BUILD
STRATA=$BUILD/bin/strata

if ((QUICK)); then
  ACCT_DURS=${BENCH_ACCT_DURS:-5}
  AB_ROUNDS=${BENCH_AB_ROUNDS:-2}
  AB_SECS=${BENCH_AB_SECS:-1}
else
  ACCT_DURS=${BENCH_ACCT_DURS:-10 30}
  AB_ROUNDS=${BENCH_AB_ROUNDS:-3}
  AB_SECS=${BENCH_AB_SECS:-2}
fi
PROFILERS=${BENCH_PROFILERS:-strata perf bpftrace}
RESULTS=${BENCH_RESULTS:-$HERE/results/record_overhead.json}
PY=$(command -v python3 || echo /usr/bin/python3)

die() {
  echo "record_overhead: $*" >&2
  exit "${2:-2}"
}

[[ $(id -u) == 0 ]] || die "needs root (BPF, perf_event, kernel.bpf_stats_enabled): run it with sudo"
[[ -x $STRATA ]] || die "no $STRATA: build first (make build, or cmake --build $BUILD --target strata)"
[[ -x $PY ]] || die "needs python3"
CC=$(command -v clang || command -v cc || true)
[[ -n $CC ]] || die "needs clang or cc to build tests/testprogs/cpu_workload.c"

# Profilers that are missing are skipped, and say so.
PROFS=()
SKIPPED=()
for p in $PROFILERS; do
  case $p in
    strata) PROFS+=(strata) ;;
    perf | bpftrace)
      if command -v "$p" >/dev/null; then PROFS+=("$p"); else SKIPPED+=("$p"); fi
      ;;
    *) die "unknown profiler $p (strata, perf, bpftrace)" 1 ;;
  esac
done
((${#SKIPPED[@]} == 0)) || echo "record_overhead: not installed, skipped: ${SKIPPED[*]}" >&2

# --- cleanup: our processes (by pid), the sysctl, the temp dir; also on Ctrl-C --------------------
T=$(mktemp -d /tmp/strata-bench.XXXXXX)
PIDS=()
STATS_PREV=$(sysctl -n kernel.bpf_stats_enabled 2>/dev/null || echo "")
cleanup() {
  local p left=0
  trap - EXIT INT TERM
  exec 3>&- 4<&- 2>/dev/null || true
  for p in "${PIDS[@]}"; do
    if kill -0 "$p" 2>/dev/null; then
      kill -TERM "$p" 2>/dev/null || true
      left=1
    fi
  done
  if ((left)); then
    sleep 1
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
  fi
  [[ -z $STATS_PREV ]] || sysctl -qw kernel.bpf_stats_enabled="$STATS_PREV" >/dev/null 2>&1 || true
  rm -rf "$T"
}
trap cleanup EXIT
trap 'echo "record_overhead: interrupted" >&2; exit 130' INT
trap 'exit 143' TERM

[[ -n $STATS_PREV ]] || die "cannot read kernel.bpf_stats_enabled"
sysctl -qw kernel.bpf_stats_enabled=1 >/dev/null || die "cannot set kernel.bpf_stats_enabled=1"
# bpftrace asks for RLIMIT_MEMLOCK; this kernel accounts BPF memory by cgroup, so it is only a warning.
ulimit -l unlimited 2>/dev/null || true

# Run a private copy of strata (its BPF programs are embedded), so a rebuild of $BUILD during the
# benchmark cannot mix two binaries into one table.
cp "$STRATA" "$T/strata"
STRATA_SRC=$STRATA
STRATA=$T/strata
# Which strata: the git revision of the build's source tree (BENCH_STRATA_REV overrides).
SRC=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BUILD/CMakeCache.txt" 2>/dev/null || true)
GIT_REV=${BENCH_STRATA_REV:-}
if [[ -z $GIT_REV ]]; then
  GIT_REV=$(git -C "${SRC:-$ROOT}" rev-parse --short HEAD 2>/dev/null || echo "?")
  [[ -z $(git -C "${SRC:-$ROOT}" status --porcelain --untracked-files=no 2>/dev/null) ]] || GIT_REV+="+dirty"
fi
LOAD0=$(cut -d' ' -f1 /proc/loadavg)

WL=$T/workload
"$CC" -O2 -g -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer -Wall -o "$WL" "$ROOT/tests/testprogs/cpu_workload.c" ||
  die "cannot build tests/testprogs/cpu_workload.c"

RAW=$T/raw.txt
: >"$RAW"

# --- measurement helpers (bash builtins only, so reading costs the profiler nothing) --------------

# cpu_ns PID: CPU time of all live threads of PID, in ns.
cpu_ns() {
  local f a s=0
  for f in /proc/"$1"/task/*/schedstat; do
    read -r a _ 2>/dev/null <"$f" || continue
    s=$((s + a))
  done
  echo "$s"
}

# bpf_of PID: "ALL_NS ALL_CNT SAMPLER_NS SAMPLER_CNT NPROGS" summed over the BPF programs whose fds
# PID holds (each program once); SAMPLER = perf_event programs (prog_type 7), the sampling part.
bpf_of() {
  local f k v id typ ns cnt seen=" " all_ns=0 all_cnt=0 s_ns=0 s_cnt=0 n=0
  for f in /proc/"$1"/fdinfo/*; do
    id="" typ="" ns="" cnt=""
    while read -r k v; do
      case $k in
        prog_type:) typ=$v ;;
        prog_id:) id=$v ;;
        run_time_ns:) ns=$v ;;
        run_cnt:) cnt=$v ;;
      esac
    done 2>/dev/null <"$f" || continue
    [[ -n $id && -n $ns && -n $cnt ]] || continue # links name a prog_id too, without run stats
    [[ $seen == *" $id "* ]] && continue
    seen+="$id "
    n=$((n + 1))
    all_ns=$((all_ns + ns))
    all_cnt=$((all_cnt + cnt))
    if [[ $typ == 7 ]]; then
      s_ns=$((s_ns + ns))
      s_cnt=$((s_cnt + cnt))
    fi
  done
  echo "$all_ns $all_cnt $s_ns $s_cnt $n"
}

# settle PID NEED_BPF: wait until PID's start-up is over (it holds BPF programs when NEED_BPF=1, and
# its CPU grew by less than 2 ms in each of the last two 0.25 s steps). 1 if it died or never settled.
settle() {
  local pid=$1 need_bpf=$2 prev cur calm=0 steps=0 b
  prev=$(cpu_ns "$pid")
  while :; do
    sleep 0.25
    steps=$((steps + 1))
    kill -0 "$pid" 2>/dev/null || return 1
    cur=$(cpu_ns "$pid")
    b=1
    if ((need_bpf)); then
      read -r _ _ _ _ b <<<"$(bpf_of "$pid")"
    fi
    if ((cur - prev < 2000000 && b > 0)); then calm=$((calm + 1)); else calm=0; fi
    prev=$cur
    ((calm >= 2 && steps >= 4)) && return 0
    ((steps < 240)) || return 1
  done
}

# wait_gone PID SECONDS: wait for our child PID to exit; KILL it after SECONDS.
wait_gone() {
  local pid=$1 i=0
  while kill -0 "$pid" 2>/dev/null && ((i < $2 * 5)); do
    sleep 0.2
    i=$((i + 1))
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  forget "$pid"
}

# forget PID: PID was reaped; cleanup must not signal whatever reuses the number.
forget() {
  local p keep=()
  for p in "${PIDS[@]}"; do [[ $p == "$1" ]] || keep+=("$p"); done
  PIDS=("${keep[@]}")
}

kv() { # kv KEY FILE: the value of KEY=VALUE in FILE's first line
  local w
  for w in $(head -n 1 "$2" 2>/dev/null); do
    [[ $w == "$1="* ]] && echo "${w#*=}" && return 0
  done
  echo ""
}

# profiler_cmd PROF DIR TARGET_PID: the command line that attaches PROF to TARGET_PID.
profiler_cmd() {
  case $1 in
    strata) echo "$STRATA record -F $HZ -o $2/strata.db -p $3" ;;
    # -e cpu-clock: what perf falls back to without a PMU anyway; its fallback with -p records nothing
    perf) echo "perf record -e cpu-clock -F $HZ -g -o $2/perf.data -p $3" ;;
    bpftrace) echo "bpftrace" ;; # its program has spaces: built in acct_run
  esac
}

# --- 1. accounting -------------------------------------------------------------------------------
acct_run() {
  local prof=$1 dur=$2 d=$T/acct-$1-$2 wpid rpid ppid c0 c1 res samples=""
  local b0 b1 line err="" w a0 n0 s0 sn0 a1 n1 s1 sn1 np
  mkdir -p "$d"
  mkfifo "$d/ctl" "$d/done"
  echo "record_overhead: accounting  $prof  ${dur} s job" >&2

  "$WL" -t "$dur" -o "$d/done" -g "$d/ctl" &
  wpid=$!
  PIDS+=("$wpid")
  # Read-write opens of the FIFOs do not block, whether or not the job got as far as opening them.
  exec 3<>"$d/ctl"  # the job waits for our "go" on it, then for "exit"
  exec 4<>"$d/done" # the job writes its result line here when its work is done

  if [[ $prof == bpftrace ]]; then
    "$PY" "$HERE/lib/rusage_run.py" "$d/pid" "$d/rusage" -- \
      bpftrace -e "profile:hz:$HZ /pid == $wpid/ { @[ustack] = count(); }" >"$d/prof.out" 2>"$d/prof.log" 3>&- 4<&- &
  else
    # shellcheck disable=SC2046
    "$PY" "$HERE/lib/rusage_run.py" "$d/pid" "$d/rusage" -- $(profiler_cmd "$prof" "$d" "$wpid") \
      >"$d/prof.out" 2>"$d/prof.log" 3>&- 4<&- &
  fi
  rpid=$!
  PIDS+=("$rpid")
  while [[ ! -s $d/pid ]] && kill -0 "$rpid" 2>/dev/null; do sleep 0.05; done
  ppid=$(cat "$d/pid" 2>/dev/null || echo "")
  [[ -n $ppid ]] && PIDS+=("$ppid")

  local need_bpf=1
  [[ $prof == perf ]] && need_bpf=0
  if [[ -z $ppid ]] || ! settle "$ppid" "$need_bpf"; then
    err="$prof did not start (see below)"
  fi

  if [[ -z $err ]]; then
    c0=$(cpu_ns "$ppid")
    b0=$(bpf_of "$ppid")
    echo go >&3
    # the job finished its work and now waits for "exit"
    read -r -t $((dur * 4 + 60)) res <&4 || err="the job did not finish"
    c1=$(cpu_ns "$ppid")
    b1=$(bpf_of "$ppid")
    kill -0 "$ppid" 2>/dev/null || err="$prof exited while the job ran"
  fi
  echo exit >&3
  exec 3>&- 4<&-
  wait_gone "$wpid" 10
  # strata and perf stop by themselves when the job exits, bpftrace does not; SIGINT is the clean
  # stop for all three.
  [[ -z $ppid ]] || kill -INT "$ppid" 2>/dev/null || true
  wait_gone "$rpid" 120
  [[ -z $ppid ]] || forget "$ppid"

  if [[ -n $err ]]; then
    echo "record_overhead: $err" >&2
    tail -n 5 "$d/prof.log" >&2 || true
    echo "kind=acct profiler=$prof dur=$dur error=1" >>"$RAW"
    return 0
  fi
  # profiler-reported samples, a sanity check
  case $prof in
    strata) samples=$(sqlite3 "$d/strata.db" "select value from agent_stats where key='samples_stored'" 2>/dev/null || true) ;;
    perf) samples=$(sed -n 's/.*(\([0-9]*\) samples).*/\1/p' "$d/prof.log" | tail -n 1) ;;
    bpftrace) samples=$(sed -n 's/^\]: \([0-9]*\)$/\1/p' "$d/prof.out" | awk '{s += $1} END {print s + 0}') ;;
  esac

  read -r a0 n0 s0 sn0 _ <<<"$b0"
  read -r a1 n1 s1 sn1 np <<<"$b1"
  line="kind=acct profiler=$prof dur=$dur"
  for w in $res; do line+=" job_$w"; done
  line+=" prof_cpu_ns=$((c1 - c0)) bpf_ns=$((a1 - a0)) bpf_cnt=$((n1 - n0))"
  line+=" sampler_ns=$((s1 - s0)) sampler_cnt=$((sn1 - sn0)) bpf_progs=$np samples=${samples:-0}"
  line+=" whole_exit=$(kv exit "$d/rusage") whole_user_s=$(kv user_s "$d/rusage") whole_sys_s=$(kv sys_s "$d/rusage")"
  if [[ $prof == strata && -s $d/strata.db ]]; then
    local k v
    while IFS='|' read -r k v; do line+=" self_$k=$v"; done < <(sqlite3 "$d/strata.db" \
      "select key, value from agent_stats where key in ('agent_cpu_s','bpf_run_s','target_cpu_s','samples_stored','ringbuf_drops','wall_s')" 2>/dev/null || true)
  fi
  echo "$line" >>"$RAW"
}

# --- 2. interleaved wall-clock A/B ------------------------------------------------------------------
# ab_one PROF N: run N batches of the job, plain or under PROF; sets AB_WALL and AB_CPU to the job's
# wall and CPU time.
AB_WALL=""
AB_CPU=""
ab_one() {
  local prof=$1 n=$2 d=$T/ab p
  mkdir -p "$d"
  rm -f "$d"/res "$d"/strata.db* "$d"/perf.data*
  case $prof in
    plain) "$WL" -n "$n" -o "$d/res" >/dev/null 2>&1 & ;;
    strata) "$STRATA" record -F "$HZ" -o "$d/strata.db" -- "$WL" -n "$n" -o "$d/res" >"$d/log" 2>&1 & ;;
    perf) perf record -q -e cpu-clock -F "$HZ" -g -o "$d/perf.data" -- "$WL" -n "$n" -o "$d/res" >"$d/log" 2>&1 & ;;
    bpftrace) bpftrace -e "profile:hz:$HZ /pid == cpid/ { @[ustack] = count(); }" -c "$WL -n $n -o $d/res" >"$d/log" 2>&1 & ;;
  esac
  p=$!
  PIDS+=("$p")
  wait "$p" || true
  forget "$p"
  AB_WALL=$(kv wall_s "$d/res")
  AB_CPU=$(kv cpu_s "$d/res")
  if [[ $prof == strata && -s $d/strata.db ]]; then # strata's own accounting in its `-- CMD` mode
    local k v line="kind=strata_self"
    while IFS='|' read -r k v; do line+=" $k=$v"; done < <(sqlite3 "$d/strata.db" \
      "select key, value from agent_stats where key in ('agent_cpu_s','bpf_run_s','target_cpu_s','samples_stored','wall_s')" 2>/dev/null || true)
    echo "$line" >>"$RAW"
  fi
  if [[ -z $AB_WALL ]]; then
    echo "record_overhead: A/B run under $prof failed:" >&2
    tail -n 5 "$d/log" >&2 || true
  fi
}

# --- run -----------------------------------------------------------------------------------------
started=$SECONDS
RATE=$("$WL" -c 1)
AB_N=$((RATE * AB_SECS))
echo "record_overhead: job = tests/testprogs/cpu_workload.c, $RATE batches/s now; A/B runs of $AB_N batches (~${AB_SECS} s)" >&2

for dur in $ACCT_DURS; do
  for prof in "${PROFS[@]}"; do acct_run "$prof" "$dur"; done
done

for prof in "${PROFS[@]}"; do
  for ((r = 1; r <= AB_ROUNDS; r++)); do
    echo "record_overhead: A/B  $prof  round $r/$AB_ROUNDS" >&2
    line="kind=ab profiler=$prof round=$r"
    for run in plain1 prof1 prof2 plain2; do
      if [[ $run == plain* ]]; then ab_one plain "$AB_N"; else ab_one "$prof" "$AB_N"; fi
      line+=" $run=$AB_WALL cpu_$run=$AB_CPU"
    done
    echo "$line" >>"$RAW"
  done
done

mkdir -p "$(dirname "$RESULTS")"
"$PY" "$HERE/lib/summarize.py" "$RAW" "$RESULTS" \
  "hz=$HZ" "quick=$QUICK" "batches_per_s=$RATE" "ab_batches=$AB_N" "ab_rounds=$AB_ROUNDS" \
  "cpus=$(nproc)" "kernel=$(uname -r)" "elapsed_s=$((SECONDS - started))" \
  "strata=$STRATA_SRC" "git=$GIT_REV" "loadavg_start=$LOAD0" "loadavg_end=$(cut -d' ' -f1 /proc/loadavg)" \
  "skipped=${SKIPPED[*]:-}"
