#!/usr/bin/env bash
# gpu-check.sh [BUILD_DIR]: the GPU and communication layers on a REAL GPU machine, end to end.
#
# Runs a small PyTorch job (matmul + NCCL all_reduce, ~50 steps) under
#   strata record -o $OUT/gpu.db -- python3 job.py
# and asserts on the recorded database that the layers saw the real thing:
#   1. collectives: NCCL allreduce rows (from the probes on the real libnccl) with sequence numbers
#      1..N per communicator;
#   2. device_activity: real kernel names from CUPTI (a cuBLAS "gemm" kernel, or "ncclDevKernel");
#   3. metrics: gpu.sm_clock_mhz from NVML (> 0);
#   4. launch_samples: sampled kernel launches with their CPU stacks;
#   5. libstrata_cupti.so wrote a GPU timeline per rank process (under $OUT/timeline).
# Prints PASS/FAIL per check and a summary; exit 0 only if all pass.
#
# Needs: root (BPF), an NVIDIA GPU with its driver (libnvidia-ml.so.1), python3 with a CUDA build of
# PyTorch and NCCL (torch.cuda.is_available(), torch.distributed.is_nccl_available()), strata built
# (BUILD_DIR, default ./build; built here with cmake if bin/strata is missing — that part is not
# bounded). The check itself is bounded: the job is killed after GPU_CHECK_TIMEOUT s (default 240).
#
# Ranks: 2 processes when the machine has 2+ GPUs (one GPU each; NCCL refuses two ranks on one GPU
# with "Duplicate GPU detected"), else 1 process — a one-rank NCCL communicator still makes every
# ncclAllReduce call (recorded with its seq); its device work is a copy, so check 2 then rests on
# the gemm kernels.
#
# Environment: OUT (default ./out/gpu-check: gpu.db, record.log, job.py, timeline/), PYTHON (the
# interpreter with torch; default: the first of python3, /usr/bin/python3 that has CUDA torch),
# GPU_CHECK_STEPS (50), GPU_CHECK_TIMEOUT (240), GPU_CHECK_RECORDER_INJECTS=1 (do not set
# CUDA_INJECTION64_PATH here: check that `strata record` injects libstrata_cupti.so by itself).
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
BUILD=${1:-${STRATA_BUILD:-$ROOT/build}}
OUT=${OUT:-./out/gpu-check}
STEPS=${GPU_CHECK_STEPS:-50}
TIMEOUT=${GPU_CHECK_TIMEOUT:-240}

mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/record.log
DB=$OUT/gpu.db
: >"$LOG"

say() { echo "gpu-check: $*" | tee -a "$LOG" >&2; }
die() {
  say "CANNOT RUN: $*"
  exit 2
}

# --- preconditions, each with what to do about it
[[ $(id -u) == 0 ]] || die "needs root (strata record loads BPF programs); run: sudo -E bash $0"
if ! ls /dev/nvidia0 >/dev/null 2>&1; then
  die "no /dev/nvidia0: this machine has no NVIDIA GPU (or the driver is not loaded; see nvidia-smi)"
fi
command -v nvidia-smi >/dev/null && nvidia-smi -L 2>&1 | tee -a "$LOG" >&2

pick_python() {
  local c
  for c in ${PYTHON:-} python3 /usr/bin/python3; do
    [[ -n $c ]] || continue
    command -v "$c" >/dev/null || continue
    if "$c" - <<'EOF' >>"$LOG" 2>&1; then
import torch, torch.distributed as dist
ok = torch.cuda.is_available() and dist.is_available() and dist.is_nccl_available()
print("python", __import__("sys").executable, "torch", torch.__version__, "cuda", torch.version.cuda,
      "gpus", torch.cuda.device_count(), "nccl", ok and ".".join(map(str, torch.cuda.nccl.version())))
raise SystemExit(0 if ok else 1)
EOF
      echo "$c"
      return 0
    fi
  done
  return 1
}
PY=$(pick_python) || die "no python3 with a CUDA build of PyTorch and NCCL (tried ${PYTHON:-} python3 /usr/bin/python3; \
see $LOG). Install one, e.g. pip install torch --index-url https://download.pytorch.org/whl/cu130, or set PYTHON="
GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>>"$LOG") || die "torch cannot count the GPUs"
RANKS=$((GPUS >= 2 ? 2 : 1))
say "python: $PY; GPUs: $GPUS; ranks: $RANKS; steps: $STEPS"

# --- strata
STRATA=$BUILD/bin/strata
if [[ ! -x $STRATA ]]; then
  say "building strata in $BUILD (not part of the time bound)"
  { cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo && cmake --build "$BUILD" -j"$(nproc)"; } \
    >>"$LOG" 2>&1 || die "build failed; see $LOG"
fi
CUPTI_LIB=$BUILD/lib/libstrata_cupti.so
[[ -r $CUPTI_LIB ]] || say "warning: $CUPTI_LIB missing: no CUPTI device records (check 2 will fail)"

# --- the job: every rank a process of its own, NCCL over TCP rendezvous on localhost
cat >"$OUT/job.py" <<'EOF'
import os, sys, time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

STEPS = int(os.environ.get("GPU_CHECK_STEPS", "50"))

def rank_main(rank, world, port):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    # Which NCCL the probes must find: the library this process mapped.
    with open("/proc/self/maps") as f:
        libs = sorted({l.split()[-1] for l in f if "nccl" in l and "/" in l})
    print(f"rank {rank}: nccl {torch.cuda.nccl.version()} from {libs or 'statically linked?'}", flush=True)
    a = torch.randn(2048, 2048, device="cuda")
    b = torch.randn(2048, 2048, device="cuda")
    grad = torch.zeros(2048 * 2048, device="cuda")  # a 16 MiB gradient bucket
    for step in range(STEPS):
        c = a @ b                     # cuBLAS gemm
        grad.add_(c.view(-1))
        dist.all_reduce(grad)         # ncclAllReduce
        torch.cuda.synchronize()
        time.sleep(0.05)              # a data-loader gap: steps have a shape to detect
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: {STEPS} steps done", flush=True)

if __name__ == "__main__":
    world = int(sys.argv[1])
    port = int(sys.argv[2])
    if world == 1:
        rank_main(0, 1, port)
    else:
        mp.start_processes(rank_main, args=(world, port), nprocs=world, start_method="spawn")
EOF

rm -f "$DB"
mkdir -p "$OUT/timeline"
export STRATA_TIMELINE_DIR=$OUT/timeline GPU_CHECK_STEPS=$STEPS STRATA_CUPTI_VERBOSE=1
if [[ ${GPU_CHECK_RECORDER_INJECTS:-0} != 1 && -r $CUPTI_LIB ]]; then
  export CUDA_INJECTION64_PATH=$CUPTI_LIB
fi
PORT=$((29500 + RANDOM % 1000))
say "recording: $STRATA record --window 1 -o $DB -- $PY $OUT/job.py $RANKS $PORT"
start=$(date +%s)
timeout -k 10 "$TIMEOUT" "$STRATA" record --window 1 -o "$DB" -- "$PY" "$OUT/job.py" "$RANKS" "$PORT" >>"$LOG" 2>&1
rc=$?
say "strata record exited $rc after $(($(date +%s) - start)) s (log: $LOG)"
[[ $rc == 124 || $rc == 137 ]] && say "the job ran past ${TIMEOUT}s and was killed"
ls -la "$OUT/timeline" >>"$LOG" 2>&1
[[ -s $DB ]] || {
  say "FAIL: no database written"
  tail -n 30 "$LOG" >&2
  exit 1
}

# --- the checks, on the database (python's sqlite3: no sqlite3 CLI needed)
"$PY" - "$DB" "$RANKS" "$STEPS" "$OUT/timeline" <<'EOF' 2>&1 | tee -a "$LOG"
import glob, os, sqlite3, sys
db, ranks, steps, tl_dir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
con = sqlite3.connect(db)
q = lambda sql, *a: con.execute(sql, a).fetchall()
results = []
def check(name, ok, detail):
    results.append(ok)
    print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")

rows = q("""SELECT pid, comm_id, comm_handle, COUNT(*), MIN(seq), MAX(seq), COUNT(DISTINCT seq)
            FROM collectives WHERE library='nccl' AND op='allreduce' GROUP BY pid, comm_id, comm_handle""")
per_pid = {}
for pid, _comm, _handle, n, lo, hi, distinct in rows:
    per_pid.setdefault(pid, []).append((n, lo, hi, distinct))
# Every call once, numbered without gaps (from 1 unless the probes attached late).
good = [p for p, cs in per_pid.items()
        if any(n >= steps and lo >= 1 and hi - lo + 1 == n and distinct == n for n, lo, hi, distinct in cs)]
check("collectives", len(good) >= ranks,
      f"ncclAllReduce per (pid, comm, handle) as (n, min seq, max seq, distinct): {rows or 'none'}; "
      f"want >= {steps} calls with consecutive seq on {ranks} process(es)")
ops = q("SELECT op, COUNT(*) FROM collectives GROUP BY op")
print(f"      all collectives by op: {ops}")

# libstrata_cupti.so wrote the device records: one timeline per process that used the GPU.
tls = {os.path.basename(f): os.path.getsize(f) for f in glob.glob(os.path.join(tl_dir, "*.timeline"))}
check("cupti timeline", len(tls) >= ranks, f"{tl_dir}: {tls or 'no *.timeline (CUPTI not injected or failed; rerun with STRATA_CUPTI_VERBOSE=1)'}")

names = [r[0] for r in q("SELECT DISTINCT name FROM device_activity")]
real = [n for n in names if "gemm" in n.lower() or "ncclDevKernel" in n or "nccl" in n.lower()]
kinds = q("SELECT kind, COUNT(*) FROM device_activity GROUP BY kind")
check("device_activity", bool(real), f"{len(names)} kernel names, real ones: {real[:5]}; by kind: {kinds}")
done = q("SELECT completion, COUNT(*) FROM collectives GROUP BY completion")
print(f"      collective completion: {done} ('device' = matched to its NCCL kernel via CUPTI)")

sm = q("SELECT label, COUNT(*), MIN(value), MAX(value) FROM metrics WHERE name='gpu.sm_clock_mhz' GROUP BY label")
check("metrics", bool(sm) and all(lo > 0 for _, _, lo, _ in sm), f"gpu.sm_clock_mhz by GPU (label, n, min, max): {sm}")
other = q("""SELECT name, ROUND(AVG(value), 1) FROM metrics WHERE label='gpu0' AND name LIKE 'gpu.%'
             GROUP BY name ORDER BY name""")
print(f"      NVML gpu0: {other}")

ls = q("SELECT COUNT(*), COALESCE(SUM(count), 0), COUNT(DISTINCT kernel) FROM launch_samples")[0]
top = q("SELECT kernel, SUM(count) c FROM launch_samples GROUP BY kernel ORDER BY c DESC LIMIT 3")
check("launch_samples", ls[0] > 0, f"{ls[0]} rows, {ls[1]} launches, {ls[2]} kernels; top: {top}")

st = q("SELECT pid, COUNT(*) FROM steps GROUP BY pid")
print(f"      steps per pid: {st} (job ran {steps})")
stats = q("""SELECT key, value FROM agent_stats WHERE key LIKE 'nvml.%' OR key LIKE '%timeline%'
             OR key LIKE '%drop%' OR key LIKE '%lost%'""")
print(f"      agent stats: {stats}")
print(f"SUMMARY: {'PASS' if all(results) else 'FAIL'} ({sum(results)}/{len(results)} checks)")
sys.exit(0 if all(results) else 1)
EOF
status=${PIPESTATUS[0]}
say "database: $DB; log: $LOG"
exit "$status"
