#!/usr/bin/env python3
"""Accuracy of `strata diagnose` on the testbed's fault suite (bench/diagnose_accuracy.sh).

Every fault kind, old and new, on random ranks with several seeds, plus healthy runs, for each workload
family:
  cpp          strata-sim with its C++ rank program (stand-in GPUs, NCCL and NVML), 4 and 8 ranks;
  py           strata-sim with its Python rank program (--python), 4 and 8 ranks;
  ddp          PyTorch DDP (gloo, CPU; testbed/workloads/ddp_train.py under Debian's python3), the
               shapes the engine has been looked at with (DDP_SEEN below: small MLP with the hotspot in
               the training loop, 4 ranks unpinned and 2 pinned; since issue 17's session also the large
               model pinned, 2 ranks with the hotspot in the loss and 4 ranks with a DataLoader worker;
               since session 9 also 4 ranks unpinned with 2 workers, the hotspot in a worker; since
               session 40 three ranks pinned on two CPUs, with and without workers); these also run
               the job-wide network-slow/all (DDP_JOB_WIDE_KINDS), the held-out ones do not;
  ddp-heldout  the same job in variants never tuned against (DDP_HELDOUT below): DataLoader workers,
               the hotspot in the loss or in a worker, three ranks pinned on two CPUs with the large
               model, three ranks unpinned with a worker, the large model unpinned.
Each run is recorded with `strata record --window 10`; the final store is diagnosed and scored against
the run's truth JSON, and the store cut at each window's end (what `strata serve` would have had then)
is diagnosed too, to measure the time from the fault's start to the first correct finding.

Runs are sequential (a 2-core machine): one run at a time, nothing else in parallel.
"""
import argparse
import json
import os
import random
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

# strata-sim's fault kinds as (label, spec after the kind's name) -- the label is the table's row. A
# spec with "rank=all" or kernel-regression is job-wide (truth rank -1).
SIM_KINDS = [
    ("cpu-contention", "cpu-contention", ""),
    ("cpu-throttling", "cpu-throttling", ""),
    ("memory-reclaim", "memory-reclaim", ""),
    ("io-stall", "io-stall", ""),
    ("io-stall/worker", "io-stall", "where=worker"),
    ("host-hotspot", "host-hotspot", ""),
    ("gpu-slow", "gpu-slow", ""),
    ("network-slow", "network-slow", ""),
    ("hang", "hang", ""),
    ("workload-imbalance", "workload-imbalance", ""),
    ("gpu-slow/all", "gpu-slow", "rank=all"),
    ("io-stall/all", "io-stall", "rank=all"),
    ("network-slow/all", "network-slow", "rank=all"),
    ("kernel-regression", "kernel-regression", ""),
    ("gpu-ecc", "gpu-ecc", ""),
    ("gpu-xid/79", "gpu-xid", "code=79"),
    ("gpu-xid/48", "gpu-xid", "code=48"),
    ("gpu-xid/74", "gpu-xid", "code=74"),
    ("pcie-degraded", "pcie-degraded", ""),
    ("nvlink-errors", "nvlink-errors", ""),
    # Device-memory calls (issue 18): the culprit's host waits in cudaMalloc/cudaFree or synchronous
    # cudaMemcpy; run with --memory-calls (SIM_FLAGS), so every rank makes a few such calls per step.
    ("alloc-churn", "alloc-churn", ""),
    ("sync-copy", "sync-copy", ""),
    # A slower core slows every rank pinned to it (the truth's "ranks"); memory-mapped data paged
    # out from outside (session 41).
    ("slow-cpu", "slow-cpu", ""),
    ("page-faults", "page-faults", ""),
    # The optimizer stepped tensor by tensor: tiny kernels launched one by one (session 42).
    ("launch-bound", "launch-bound", ""),
    # Network receive work steered (RPS) to the culprit's CPU, NET_RX softirq stealing from every
    # rank there (session 44).
    ("irq-softirq", "irq-softirq", ""),
]
# strata-sim flags of a kind's runs (C++ rank only), and the healthy runs made with them too.
SIM_FLAGS = {"alloc-churn": ["--memory-calls"], "sync-copy": ["--memory-calls"]}
MEMORY_CALLS_HEALTHY = ["--memory-calls"]
# Faults of the hardware's counters: found whether or not the job is slower yet (an ECC error costs
# nothing until it does), so "did it slow the job" does not gate their score.
HARDWARE = {"gpu-ecc", "gpu-xid", "pcie-degraded", "nvlink-errors"}
# Python ranks: the kinds strata-sim's rank.py runs (no data-loader worker there, no device-memory
# calls, no slower CPU work and no memory-mapped data of its own: strata-sim refuses those).
PY_SKIP = {"io-stall/worker", "alloc-churn", "sync-copy", "slow-cpu", "page-faults"}

# PyTorch DDP (gloo, CPU): the faults that apply to a CPU job, each sized to stand out on a shared
# 2-core machine.
DDP_KINDS = [("host-hotspot", "host-hotspot", "ms=150"), ("workload-imbalance", "workload-imbalance", "factor=3"),
             ("cpu-contention", "cpu-contention", "hogs=2"), ("cpu-throttling", "cpu-throttling", "quota_pct=10"),
             ("network-slow", "network-slow", "rate_mbit=40"),
             # Network receive work steered to the culprit's CPU (session 44, never run on DDP before
             # it was added here): ddp_train.py's IrqSteer, the same mechanism as strata-sim's.
             ("irq-softirq", "irq-softirq", "")]
# Job-wide DDP faults (truth rank -1, scope job): a slow fabric, every rank's link limited alike
# (ddp_train.py's network-slow:rank=all: each rank in a namespace of its own behind a veth, tbf on
# both ends of every link), at the single-rank row's rate. Held in: run on the DDP_SEEN variants only,
# as the engine was looked at with it (the jobnet session); the held-out variants do not get it.
DDP_JOB_WIDE_KINDS = [("network-slow/all", "network-slow", "rank=all,rate_mbit=40")]
# Variants: (name, ranks, ddp_train.py flags, where the host hotspot burns).
DDP_SEEN = [("r4", 4, [], "loop"),
            ("r2-pin", 2, ["--pin"], "loop"),
            # Held out until a session looked at them (issue 17: their misses were traced and fixed
            # by general rules -- steps cut apart per rank, a job-wide network rule without network
            # evidence): seen from then on.
            ("r2-large-pin", 2, ["--model", "large", "--pin"], "loss"),
            ("r4-large-w1-pin", 4, ["--model", "large", "--num-workers", "1", "--pin"], "worker"),
            # Held out until session 9 looked at it (issue 17: missed in every run that slowed the
            # job; traced: the rank's 2 prefetching workers never made its own loop wait, so every
            # rank slowed alike waiting for the CPUs the workers took, and no rule named a rank's own
            # processes taking the shared CPUs; fixed by a general rule in find_slowed_alike).
            ("r4-w2", 4, ["--num-workers", "2"], "worker"),
            # Held out until session 40 looked at it (issue 17: its workload-imbalance run was
            # named network-slow on the whole job; traced: the straggler's two peers' spread was
            # taken as noise, fixed by a general rule -- two other ranks are no noise sample).
            ("r3-pin", 3, ["--pin"], "loss"),
            # Held out until session 40 (issue 17): the rule above made its worker-hotspot run an
            # unexplained straggler on the rank that shares the hot worker's CPU; traced and fixed by
            # a general rule (stragglers waiting for another rank's processes name that rank's work).
            ("r3-w2-pin", 3, ["--num-workers", "2", "--pin"], "worker")]
# Held out: never looked at to change the engine (bench/README.md says so too).
DDP_HELDOUT = [("r2-w2", 2, ["--num-workers", "2"], "loss"),
               # Added when two earlier variants moved to DDP_SEEN, chosen before any run of them: three
               # ranks pinned on two CPUs (two share one; seen since session 40), and the large model
               # unpinned with a worker.
               ("r2-large-w1", 2, ["--model", "large", "--num-workers", "1"], "loop"),
               # Added when r3-pin and r3-w2-pin moved to DDP_SEEN (session 40), named and committed
               # before any run of them: the large model on three ranks pinned on two CPUs, the
               # hotspot in the loop; and three ranks unpinned with a worker each, the hotspot in the
               # worker.
               ("r3-large-pin", 3, ["--model", "large", "--pin"], "loop"),
               ("r3-w1", 3, ["--num-workers", "1"], "worker")]
FAMILIES = ["cpp", "py", "ddp", "ddp-heldout"]
# The large model (7x the parameters, a 2.4 MB gradient all-reduce) steps several times slower on a
# CPU: a third of the steps still leaves several 10 s windows after the fault on a quiet machine.
LARGE_STEP_DIVISOR = 3

# Targets (issue 17), per workload family.
TARGET_RANK, TARGET_CAUSE, TARGET_CULPRIT, TARGET_P90_S = 0.97, 0.90, 0.90, 20.0


def run(cmd, env=None, timeout=600):
    """Runs cmd in a session of its own; on a timeout the whole session is killed (the job under
    `strata record`, its ranks and fault processes), not just cmd, and TimeoutExpired raised."""
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.communicate()
        raise
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def diagnose(strata, db):
    r = run([strata, "diagnose", db, "--json"])
    if r.returncode != 0:
        return {"error": r.stderr.strip(), "findings": []}
    return json.loads(r.stdout)


def cut_store(src, dst, t_ns):
    """A copy of the store as it stood at unix time t_ns: rows that ended later are dropped."""
    shutil.copyfile(src, dst)
    con = sqlite3.connect(dst)
    c = con.cursor()
    c.execute("DELETE FROM stack_counts WHERE window_id IN (SELECT id FROM windows WHERE end_ns > ?)", (t_ns,))
    c.execute("DELETE FROM windows WHERE end_ns > ?", (t_ns,))
    c.execute("DELETE FROM metrics WHERE end_ns > ?", (t_ns,))
    c.execute("DELETE FROM steps WHERE end_ns > ?", (t_ns,))
    c.execute("DELETE FROM collectives WHERE enter_ns > ?", (t_ns,))
    # A collective still in flight at t: its completion was not known yet.
    c.execute("UPDATE collectives SET device_start_ns = 0, device_end_ns = 0, completion = 'none' "
              "WHERE device_end_ns > ?", (t_ns,))
    c.execute("DELETE FROM device_activity WHERE end_ns > ?", (t_ns,))
    c.execute("DELETE FROM launch_samples WHERE end_ns > ?", (t_ns,))
    con.commit()
    con.close()


def fault_start_ns(db, truth):
    """When the fault began: the start of the culprit's first faulty step (steps count from 1). A
    job-wide fault (rank -1) is timed by rank 0's steps."""
    f = truth["fault"]
    rank = f.get("rank")
    pid = truth["pids"].get(str(0 if rank == -1 else rank))
    if pid is None:
        return None
    con = sqlite3.connect(db)
    row = con.execute("SELECT start_ns FROM steps WHERE pid = ? AND step = ?", (pid, f["start_step"] + 1)).fetchone()
    con.close()
    return row[0] if row else None


def named_cause(finding):
    """Before session 29 a straggler whose cause was not known was reported as host-hotspot with
    culprit "unknown" (results of older runs hold them): the rank was found, the cause was not. Now
    it is no finding but an "unexplained" line of the diagnosis (counted apart)."""
    return finding["culprit"] != "unknown"


def located(finding, fault, world):
    """The finding points at the fault's rank (or at one of the ranks it acts on: "ranks"). A job of two ranks has one link: a slow end of it and
    the other end's slow receive stretch the same connections alike, so the engine names "the link
    between rank 0 and rank 1" at job scope (engine.cpp, find_slow_link) and no rank can be singled
    out. That finding locates a network fault on either rank: the link it names is the faulty one."""
    if finding["rank"] == fault.get("rank") or finding["rank"] in fault.get("ranks", []):
        return True  # "ranks": every rank the fault acts on (slow-cpu: all on the slower core)
    return (world == 2 and finding.get("scope") == "job" and finding["cause"] == "network-slow" == fault.get("cause")
            and "the link between rank 0 and rank 1" in finding.get("culprit", ""))


def correct(finding, truth):
    f = truth["fault"]
    return located(finding, f, len(truth.get("per_rank", []))) and finding["cause"] == f.get("cause") and named_cause(finding)


def culprit_named(finding, fault, world=0):
    if fault["culprit"].lower() in finding["culprit"].lower():
        return True
    # A job of two ranks has one link (see located): a slow end of it on either rank is named by
    # that link, the only one there is, as it is located by it. (Before session 33 only `located`
    # accepted it, so such a run counted as found but its culprit as not named.)
    if (world == 2 and fault.get("rank") in (0, 1) and fault.get("cause") == "network-slow" == finding["cause"]
            and finding.get("scope") == "job" and "the link between rank 0 and rank 1" in finding["culprit"]):
        return True
    # A slow fabric (a job-wide network fault, truth culprit "communicator") is named by what the
    # ranks' collectives share: their communicator, "the job's collectives" where the job's
    # communicator has no recorded id (gloo, DDP), or a job of two ranks' one link (see located).
    return (fault.get("rank") == -1 and fault.get("cause") == "network-slow" == finding["cause"]
            and finding.get("scope") == "job"
            and any(k in finding["culprit"] for k in ("communicator", "the job's collectives",
                                                        "the link between rank 0 and rank 1")))


# -- The gate of a run's score: did the fault itself slow the job?
#
# A run is scored only when the fault had an effect; a fault that did nothing (memory pressure the
# machine absorbs, a worker hotspot that prefetching hides) has nothing to find. "The job got slower
# after the fault's start" is not that effect on a shared machine: the load of other work slows the
# job too, and crediting the fault with it scores a run where the fault did nothing as a miss. So
# the effect is measured on what the fault itself changes, each against an in-run control that lives
# through the same load (the culprit's peers, the ranks' own host work), from the recorded store:
#   - straggler: the culprit rank's busy time per iteration (step minus collective wait) beyond its
#     peers' median, after the start minus before it. Load that slows every rank alike cancels; what
#     the fault adds to the culprit's own work (a hotspot, a hog on its CPU, a quota, a slow read)
#     is what its peers then wait for. Capped by how much further the culprit got ahead of the
#     slowest of its peers (_lead_change): a synchronous step waits for its slowest rank, so extra
#     work that leaves the culprit no slower than a rank already slower than the median adds nothing
#     to the step (an 8-rank py job, ranks pinned four to a CPU: the culprit's +40 ms on the quieter
#     CPU made it as busy as the other CPU's ranks, 117 ms against their 116, and the job's step did
#     not change; scored as a miss before).
#   - device: the culprit's device compute per iteration (the device timeline's kernels, where it
#     timed every step) beyond its peers' median and ahead of the slowest, after the start minus
#     before. A slower GPU stretches its own rank's kernels; its host waits for them inside the
#     step's collective (the stand-in syncs there, as NCCL's host calls wait on a stream), so the
#     busy time above does not show it (the cpp gpu-slow runs: straggler +0.9 ms, job +91 ms:
#     never scored before).
#   - own CPU: the CPU time per iteration of the culprit's processes (its DataLoader workers counted)
#     beyond its peers' median, after the start minus before it (the peers only, when no metrics
#     window lies wholly inside the healthy stretch), capped by the job's own slowdown. Work that
#     takes CPUs every rank shares slows every rank alike, with no straggler; it slows the job by at
#     most the CPU it takes.
#   - link (a fault of the comm layer): every rank's collective wait per iteration grew beyond the
#     growth of its busy time (medians over ranks). A slower wire stretches the collectives only;
#     load stretches the host work too, and gloo's collectives (which reduce on the CPU) with it.
#   - job-wide faults (truth rank -1) have no in-run control (every rank carries the fault): the job
#     against its own past, its median iteration time after the start minus before, at the bar of
#     JOB_WIDE_EFFECT_SHARE; of the comm layer, the link measure at that bar.
# A rank channel also has to pass the drift of the culprit's peers measured the same way in the same
# run (each peer's excess over the other peers, the culprit left out): ranks drift apart by
# themselves when the load changes during a run. Pinned ranks that share CPUs unevenly can still
# drift apart by themselves (the peers drift together, the culprit apart), and a 2-rank job has no
# second peer: there the bar alone decides. Checked on the healthy DDP runs that session 9 kept
# (steps of 1.4-1.8 s at load 10+), with a made-up fault on each rank at steps 8, 11, 14: 3 of 21
# pass, the same 3 without the drift test (which changed no verdict on the runs at hand): a machine
# that loaded makes the gate, like the diagnosis, unreliable; run the bench quiet.
# Hangs and hardware faults are scored whatever the step time says.
#
# The effect needed, as a share of the job's healthy iteration time: the engine's own bar for "the
# job is slower" (diagnose::Options::min_slowdown, 5%); an effect under it is one the diagnosis is not
# meant to find.
EFFECT_SHARE = 0.05
# A strata-sim job-wide fault starts at this step at the earliest: at the sim's 130-200 ms steps,
# 20-30 s in, so that the first 10 s window (the ranks' start-up, which the engine leaves out of
# the job's past) is followed by a whole healthy one. 90 steps of an 8-rank run (15-17 s) left the
# fault inside the second window: an 8-rank py run's first window held 13% start-up, and its
# job-wide I/O stall had no OS past to be told from.
JOB_WIDE_MIN_START = 150
# A job-wide fault's bar: the engine's kJobWideSlowdown (15%), the drift a loaded machine's speed
# shows with no cause at all (diagnose/engine.cpp); with no rank to compare with, a job-wide
# slowdown under it cannot be told from that drift.
JOB_WIDE_EFFECT_SHARE = 0.15
# The first step rows of each rank are start-up (connections, first allocations), not the healthy
# stretch: ddp_train.py's WARMUP, strata-sim's step 0.
WARMUP_ROWS = 2


def _span_shares(rows):
    """(collective share, seconds) of a rank's step rows: a share of the time they cover, which does not
    depend on where the agent cut the steps (gloo's steps may be cut at a fraction of an iteration)."""
    dur = sum(e - s for s, e, _ in rows)
    coll = sum(c for _, _, c in rows)
    return (coll / dur if dur > 0 else None), dur / 1e9


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _excess_change(values, rank, others):
    """values[k] = (before, after) per rank: how much rank k's excess over the median of `others` grew
    from before to after; None when a value is missing."""
    ex = []
    for i in (0, 1):
        mine, theirs = values[rank][i], _median([values[p][i] for p in others])
        if mine is None or theirs is None:
            return None
        ex.append(mine - theirs)
    return ex[1] - ex[0]


def _lead_change(values, rank, others):
    """values[k] = (before, after) per rank: how much further rank k got ahead of the slowest of
    `others` (its lead, 0 when it is not the slowest), after minus before; None when a value is
    missing."""
    lead = []
    for i in (0, 1):
        theirs = [values[p][i] for p in others]
        if values[rank][i] is None or not theirs or any(v is None for v in theirs):
            return None
        lead.append(max(0.0, values[rank][i] - max(theirs)))
    return lead[1] - lead[0]


def _peer_drift(values, peers):
    """The in-run noise of an excess change: the largest change of a peer's excess over the other peers
    (the culprit left out, so that its own change is not mirrored in them), measured the same way under
    the same load. None with fewer than two peers (a 2-rank job has no second peer to drift from)."""
    if len(peers) < 2:
        return None
    drifts = [_excess_change(values, p, [q for q in peers if q != p]) for p in peers]
    drifts = [abs(d) for d in drifts if d is not None]
    return max(drifts) if drifts else None


def fault_effect(db, truth, t_fault):
    """The fault's own effect in ms per iteration, by channel (see above); None where a channel cannot be
    measured. Iteration times are the workload's own (truth per_rank step_ms, before and after)."""
    f = truth["fault"]
    per = {str(r["rank"]): r for r in truth["per_rank"]}
    it = {}
    for k, r in per.items():
        if r.get("fault_window") and r.get("baseline"):
            it[k] = (r["baseline"]["step_ms"], r["fault_window"]["step_ms"])
    pids = {k: v for k, v in truth["pids"].items() if k in it}
    out = {"base_ms": _median([b for b, _ in it.values()]),
           "job_ms": None, "straggler_ms": None, "own_cpu_ms": None, "device_ms": None, "link_ms": None}
    if out["base_ms"] is None:
        return out
    out["job_ms"] = _median([a for _, a in it.values()]) - out["base_ms"]
    if t_fault is None or not pids:
        return out
    con = sqlite3.connect(db)
    busy, wait, device = {}, {}, {}
    first_step = None
    for k, pid in pids.items():
        full = con.execute("SELECT start_ns, end_ns, collective_ns, device_compute_ns, device_known FROM steps "
                           "WHERE pid = ? ORDER BY start_ns", (pid,)).fetchall()[WARMUP_ROWS:]
        rows = [x[:3] for x in full]
        if rows:
            first_step = rows[0][0] if first_step is None else min(first_step, rows[0][0])
        before = [x for x in rows if x[1] <= t_fault]
        after = [x for x in rows if x[0] >= t_fault]
        cb, _ = _span_shares(before)
        ca, _ = _span_shares(after)
        if cb is None or ca is None:
            continue
        b_ms, a_ms = it[k]
        wait[k] = (cb * b_ms, ca * a_ms)
        busy[k] = ((1 - cb) * b_ms, (1 - ca) * a_ms)
        # Device compute per iteration, as a share of the time the steps cover (as the waits), where
        # the device timeline timed every step of the phase.
        shares = []
        for phase in ([x for x in full if x[1] <= t_fault], [x for x in full if x[0] >= t_fault]):
            dur = sum(e - st for st, e, *_ in phase)
            shares.append(sum(x[3] for x in phase) / dur if dur > 0 and phase and all(x[4] for x in phase) else None)
        if None not in shares:
            device[k] = (shares[0] * b_ms, shares[1] * a_ms)
    rank = f.get("rank")
    culprit = str(rank) if rank is not None and rank >= 0 else None
    # The other ranks the fault acts on (slow-cpu: those on the slower core) are no peers to hold it against.
    acted = {str(r) for r in f.get("ranks", [])} - {culprit}
    if culprit in busy and len(busy) > 1:
        peers = [k for k in busy if k != culprit and k not in acted]
        out["straggler_ms"] = _excess_change(busy, culprit, peers)
        lead = _lead_change(busy, culprit, peers)
        if out["straggler_ms"] is not None and lead is not None:
            out["straggler_ms"] = min(out["straggler_ms"], lead)
    if culprit in device and len(device) == len(busy) and len(device) > 1:
        peers = [k for k in device if k != culprit and k not in acted]
        out["device_ms"] = _excess_change(device, culprit, peers)
        lead = _lead_change(device, culprit, peers)
        if out["device_ms"] is not None and lead is not None:
            out["device_ms"] = min(out["device_ms"], lead)
        out["device_noise_ms"] = _peer_drift(device, peers)
        out["straggler_noise_ms"] = _peer_drift(busy, peers)
    if len(busy) == len(pids) and busy:
        dw = _median([wait[k][1] - wait[k][0] for k in wait])
        db_ = _median([busy[k][1] - busy[k][0] for k in busy])
        out["link_ms"] = dw - max(0.0, db_)
    if culprit in pids and len(pids) > 1 and first_step is not None:
        # CPU time of each rank's processes (the rank's pid and the processes the agent counted for
        # it: its DataLoader workers), per second of the metrics windows, in the healthy stretch
        # (windows wholly between the first step and the start) and after the start.
        ranks_of = {}
        for pid, rk in con.execute("SELECT pid, rank FROM processes WHERE rank >= 0"):
            ranks_of[pid] = str(rk)
        rate = {k: [[0.0, set()], [0.0, set()]] for k in pids}
        for pid, s, e, v in con.execute("SELECT pid, start_ns, end_ns, value FROM metrics WHERE name = 'os.cpu_time_us'"):
            k = ranks_of.get(pid)
            if k not in rate:
                continue
            phase = 0 if (s >= first_step and e <= t_fault) else 1 if s >= t_fault else None
            if phase is None:
                continue
            rate[k][phase][0] += v / 1e3
            rate[k][phase][1].add((s, e))
        per_iter = {}
        for k, phases in rate.items():
            vals = []
            for i, (cpu_ms, spans) in enumerate(phases):
                span_ms = sum(e - s for s, e in spans) / 1e6
                vals.append(cpu_ms / span_ms * it[k][i] if span_ms > 0 else None)
            per_iter[k] = vals
        peers = [k for k in per_iter if k != culprit and k not in acted]
        ex = [None, None]
        for i in (0, 1):
            mine, theirs = per_iter[culprit][i], _median([per_iter[p][i] for p in peers])
            ex[i] = mine - theirs if mine is not None and theirs is not None else None
        if ex[1] is not None:
            grew = ex[1] - ex[0] if ex[0] is not None else ex[1]
            out["own_cpu_ms"] = min(grew, out["job_ms"])
            out["own_cpu_against"] = "past" if ex[0] is not None else "peers"
            if ex[0] is not None:
                out["own_cpu_noise_ms"] = _peer_drift(per_iter, peers)
    con.close()
    return out


def manifest(truth, kind, db=None, t_fault=None):
    """(whether the fault itself slowed the job, the measures it was judged by): see fault_effect."""
    if kind == "hang" or kind in HARDWARE:
        return True, {}
    if db is None or not os.path.exists(db):
        return False, {}
    e = fault_effect(db, truth, t_fault)
    base = e["base_ms"]
    if base is None or base <= 0:
        return False, e
    f = truth["fault"]
    comm = f.get("layer") == "comm"
    if f.get("rank") == -1:
        measure = e["link_ms"] if comm else e["job_ms"]
        e["bar_ms"] = JOB_WIDE_EFFECT_SHARE * base
    else:
        e["bar_ms"] = EFFECT_SHARE * base
        if comm:
            channels = [(e["link_ms"], None)]
        else:
            channels = [(e["straggler_ms"], e.get("straggler_noise_ms")), (e["own_cpu_ms"], e.get("own_cpu_noise_ms")),
                        (e["device_ms"], e.get("device_noise_ms"))]
        # A channel counts when its change passes the bar and the peers' own drift, measured the same
        # way in the same run: under a load that changes during the run, ranks drift apart by themselves
        # (healthy 4-rank DDP runs at load 10+: 70 ms of 1.4 s between a run's first steps and the rest).
        passed = [x for x, noise in channels if x is not None and x >= e["bar_ms"] and (noise is None or x > noise)]
        known = [x for x, _ in channels if x is not None]
        measure = max(passed) if passed else (max(known) if known else None)
        e["effect_ms"] = measure
        return bool(passed), e
    e["effect_ms"] = measure
    return measure is not None and measure >= e["bar_ms"], e


def effect_text(res):
    """The gate's measures of a run, for its log line."""
    e = res.get("effect") or {}
    if res.get("manifest") is None:
        return "-"
    if not e:
        return "scored whatever the step time (hang / hardware)" if res["manifest"] else "not measured"
    parts = []
    for key in ("straggler_ms", "own_cpu_ms", "device_ms", "link_ms", "job_ms"):
        if e.get(key) is not None:
            noise = e.get(key[:-3] + "_noise_ms")
            parts.append(f"{key[:-3]} {e[key]:+.1f} ms" + (f" (peers drift {noise:.1f})" if noise is not None else ""))
    bar = f"bar {e['bar_ms']:.1f} ms" if e.get("bar_ms") is not None else "no baseline"
    return f"{'yes' if res['manifest'] else 'no'} ({', '.join(parts)}; {bar})"


def first_correct_latency(strata, db, truth, workdir):
    """Seconds from the fault's start to the end of the first window whose store (cut there, as
    `strata serve` would have had it) is diagnosed right; None when none is."""
    t_fault = fault_start_ns(db, truth)
    if t_fault is None:
        return None
    con = sqlite3.connect(db)
    ends = sorted({e for (e,) in con.execute("SELECT end_ns FROM windows")})
    con.close()
    cut = os.path.join(workdir, "cut.db")
    try:
        for t in ends:
            if t < t_fault:
                continue
            d = diagnose(strata, db) if t == ends[-1] else None
            if d is None:
                cut_store(db, cut, t)
                d = diagnose(strata, cut)
            if d["findings"] and correct(d["findings"][0], truth):
                return (t - t_fault) / 1e9
        return None
    finally:
        for p in (cut, cut + "-wal", cut + "-shm"):
            if os.path.exists(p):
                os.remove(p)


class Case:
    """One run of the matrix."""

    def __init__(self, family, label, kind, opts, ranks, seed, variant=None, flags=(), where="loop"):
        self.family, self.label, self.kind, self.opts = family, label, kind, opts
        self.ranks, self.seed, self.variant, self.flags, self.where = ranks, seed, variant, list(flags), where

    def name(self):
        v = "-" + self.variant if self.variant else ""
        return f"{self.label.replace('/', '_')}-{self.family}{v}-r{self.ranks}-s{self.seed}"


def one_run(args, case, workdir, log):
    # A string seed: reproducible across runs (tuple hashes are salted per process).
    rng = random.Random(f"{case.label}/{case.ranks}/{case.family}/{case.variant}/{case.seed}")
    rank = rng.randrange(case.ranks)
    start = rng.randrange(8, 15)
    ddp = case.family.startswith("ddp")
    steps = args.steps_ddp if ddp else (args.steps_4 if case.ranks <= 4 else args.steps_8)
    if "large" in case.flags:
        steps = max(40, steps // LARGE_STEP_DIVISOR)
    opts = [o for o in case.opts.split(",") if o]
    job_wide = "rank=all" in opts or case.kind == "kernel-regression"
    if job_wide:
        # Every rank slowed alike is told from the job's own healthy past, so that past must hold
        # at least one whole healthy 10 s window after the first (which holds the start-up): the
        # fault starts after the run's usual steps, and at least JOB_WIDE_MIN_START of them.
        start = steps if ddp else max(steps, JOB_WIDE_MIN_START)
        steps += start
    if case.kind == "none":
        spec = "none"
    else:
        items = ([] if job_wide else [f"rank={rank}"]) + [f"start_step={start}"] + opts
        if ddp and case.kind == "host-hotspot":
            items.append(f"where={case.where}")
        spec = f"{case.kind}:" + ",".join(items)
    name = case.name()
    db = os.path.join(workdir, name + ".db")
    truth_path = os.path.join(workdir, name + ".json")
    if ddp:
        sim = ["/usr/bin/python3", "testbed/workloads/ddp_train.py", "--ranks", str(case.ranks), "--steps", str(steps),
               "--fault", spec, "--truth", truth_path] + case.flags
    else:
        sim = [os.path.join(args.build, "bin", "strata-sim"), "run", "--ranks", str(case.ranks), "--steps", str(steps),
               "--fault", spec, "--seed", str(case.seed), "--truth", truth_path, "--hang-timeout", "25", "--quiet"]
        if case.family == "py":
            sim.append("--python")
        sim += case.flags
    env = dict(os.environ)
    env["STRATA_NVML_LIBRARY"] = os.path.join(args.build, "testbed", "lib", "libnvidia-ml.so.1")
    # A stand-in GPU state of the run's own: another strata-sim on this machine (a test, a second
    # bench) maps the shared default, and its injected hardware faults would show in this run.
    testbed_dir = os.path.join(workdir, "testbed-" + name)
    os.makedirs(testbed_dir, exist_ok=True)
    env["STRATA_TESTBED_DIR"] = testbed_dir
    t0 = time.time()
    try:
        r = run([args.strata, "record", "--window", "10", "-o", db, "--"] + sim, env=env, timeout=args.run_timeout)
    except subprocess.TimeoutExpired:
        # A run the loaded machine could not finish in time is logged and left out, not scored.
        log.write(f"{name}: {spec}; did not finish in {args.run_timeout} s (load average "
                  f"{os.getloadavg()[0]:.1f}): left out\n")
        log.flush()
        shutil.rmtree(testbed_dir, ignore_errors=True)
        return None
    wall = time.time() - t0
    shutil.rmtree(testbed_dir, ignore_errors=True)
    if not os.path.exists(truth_path):
        log.write(f"{name}: no truth (record rc={r.returncode}): {r.stderr[-300:]}\n")
        log.flush()
        return None
    truth = json.load(open(truth_path))
    dx = diagnose(args.strata, db)
    effect, measures = (manifest(truth, case.kind, db, fault_start_ns(db, truth)) if case.kind != "none"
                        else (None, {}))
    res = {"name": name, "family": case.family, "kind": case.label, "variant": case.variant, "ranks": case.ranks,
           "seed": case.seed, "spec": spec, "wall_s": wall, "findings": dx.get("findings", []),
           "unexplained": dx.get("unexplained", []),
           "error": dx.get("error"), "truth": truth["fault"], "manifest": effect, "effect": measures,
           "latency_s": None}
    if case.kind != "none":
        res["latency_s"] = first_correct_latency(args.strata, db, truth, workdir)
    top = res["findings"][0] if res["findings"] else None
    tf = truth["fault"]
    log.write(f"{name}: {spec}; truth rank {tf.get('rank')} {tf.get('cause')} ({tf.get('culprit')}); "
              f"got {json.dumps(top) if top else 'no finding'}; {len(res['findings'])} finding(s); "
              f"{len(res['unexplained'])} unexplained straggler(s) {[u['rank'] for u in res['unexplained']]}; "
              f"latency {res['latency_s']}; effect {effect_text(res)}; {wall:.0f} s\n")
    log.flush()
    if not args.keep:
        for p in (db, db + "-wal", db + "-shm", truth_path):
            if os.path.exists(p):
                os.remove(p)
    return res


def pct(a, b):
    return f"{100.0 * a / b:5.1f}%" if b else "    -"


def p90(xs):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.9 * (len(xs) - 1))))]


def is_interference(f):
    """On a shared machine a healthy job can really be slowed by another process on its CPUs; a
    finding that names such a process (not the testbed's own hog) is told apart, not hidden."""
    return f["cause"] == "cpu-contention" and f["culprit"] != "strata-hog"


def false_findings(r):
    """Findings that are not the fault: any finding of a healthy run, else every finding whose rank
    and cause are not the truth's."""
    if r["kind"] == "none":
        return [f for f in r["findings"] if not is_interference(f)]
    t = r["truth"]
    return [f for f in r["findings"] if not (located(f, t, r["ranks"]) and f["cause"] == t.get("cause"))]


def summarize_family(family, results, lines):
    rs_all = [r for r in results if r["family"] == family]
    if not rs_all:
        return
    lines.append(f"== {family} ({len(rs_all)} runs) ==")
    lines.append(f"{'kind':<20} {'runs':>4} {'no-eff':>6} {'rank@1':>7} {'cause@1':>7} {'culprit':>7} "
                 f"{'false':>5} {'lat p50':>7} {'lat p90':>7}")
    tot = {"n": 0, "rank": 0, "cause": 0, "culprit": 0, "false": 0}
    lats_all = []
    labels = []
    for r in rs_all:
        if r["kind"] != "none" and r["kind"] not in labels:
            labels.append(r["kind"])
    for kind in labels:
        rs = [r for r in rs_all if r["kind"] == kind]
        eff = [r for r in rs if r["manifest"]]
        noeff = len(rs) - len(eff)
        rk = sum(1 for r in eff if r["findings"] and located(r["findings"][0], r["truth"], r["ranks"]))
        ca = sum(1 for r in eff if r["findings"] and r["findings"][0]["cause"] == r["truth"]["cause"]
                 and named_cause(r["findings"][0]))
        cu = sum(1 for r in eff if r["findings"] and culprit_named(r["findings"][0], r["truth"], r["ranks"]))
        fa = sum(len(false_findings(r)) for r in eff)
        lats = [r["latency_s"] for r in eff if r["latency_s"] is not None]
        # A run with effect and no correct finding at all counts as never found: the p90 is then
        # "never" once more than a tenth of the runs miss.
        missed = len(eff) - len(lats)
        lat_p90 = p90(lats + [float("inf")] * missed) if eff else None
        p50 = f"{statistics.median(lats):6.1f}s" if lats else "      -"
        p9 = "  never" if lat_p90 == float("inf") else (f"{lat_p90:6.1f}s" if lat_p90 is not None else "      -")
        lines.append(f"{kind:<20} {len(rs):>4} {noeff:>6} {pct(rk, len(eff)):>7} {pct(ca, len(eff)):>7} "
                     f"{pct(cu, len(eff)):>7} {fa:>5} {p50:>7} {p9:>7}")
        tot["n"] += len(eff)
        tot["rank"] += rk
        tot["cause"] += ca
        tot["culprit"] += cu
        tot["false"] += fa
        lats_all += lats + [float("inf")] * missed
    healthy = [r for r in rs_all if r["kind"] == "none"]
    hfalse = sum(1 for r in healthy if false_findings(r))
    real = [r["findings"][0]["culprit"] for r in healthy if r["findings"] and not false_findings(r)]
    extra = (f" (+{len(real)} naming a foreign process on the job's CPUs: {', '.join(sorted(set(real)))})"
             if real else "")
    lp90 = p90(lats_all)
    lp90s = "never" if lp90 == float("inf") else (f"{lp90:.1f} s" if lp90 is not None else "-")
    lines.append(f"{'all (with effect)':<20} {tot['n']:>4} {'':>6} {pct(tot['rank'], tot['n']):>7} "
                 f"{pct(tot['cause'], tot['n']):>7} {pct(tot['culprit'], tot['n']):>7} {tot['false']:>5} "
                 f"{'':>7} {lp90s:>7}")
    # A straggler no layer explains is no finding (so not false), but the job is not called healthy
    # either: counted apart, so a rule that turns false findings into such lines cannot hide them.
    hunex = sum(1 for r in healthy if r.get("unexplained"))
    lines.append(f"{'healthy (none)':<20} {len(healthy):>4} runs, runs with a false finding: {hfalse}{extra}; "
                 f"with an unexplained straggler: {hunex}")
    if tot["n"]:
        miss = []
        if tot["rank"] < TARGET_RANK * tot["n"]:
            miss.append("rank")
        if tot["cause"] < TARGET_CAUSE * tot["n"]:
            miss.append("cause")
        if tot["culprit"] < TARGET_CULPRIT * tot["n"]:
            miss.append("culprit")
        if lp90 is None or lp90 > TARGET_P90_S:
            miss.append("p90 latency")
        if hfalse:
            miss.append("healthy false findings")
        lines.append(f"targets (rank >= {TARGET_RANK:.0%}, cause >= {TARGET_CAUSE:.0%}, culprit >= "
                     f"{TARGET_CULPRIT:.0%}, p90 <= {TARGET_P90_S:.0f} s, 0 false on healthy): "
                     + ("met" if not miss else "MISSED: " + ", ".join(miss)))
    lines.append("")


def summarize(results, out, quiet=False):
    lines = ["(rank@1 / cause@1 / culprit: the top finding's; false: findings on runs with effect whose rank or "
             "cause is not the fault's; latency: fault start -> first correct finding, 10 s windows; "
             "no-eff: the fault's own effect was under the bar here (see fault_effect), not scored)", ""]
    for fam in FAMILIES:
        summarize_family(fam, results, lines)
    text = "\n".join(lines)
    if not quiet:
        print(text)
    out.write(text + "\n")


def build_matrix(args):
    families = args.families.split(",")
    for f in families:
        if f not in FAMILIES:
            sys.exit(f"diagnose_accuracy: unknown family '{f}' (known: {', '.join(FAMILIES)})")
    only = set(args.kinds.split(",")) if args.kinds else None

    def want(label):
        return only is None or label in only or label.split("/")[0] in only

    m = []
    if args.quick:
        # One of each family's most telling shapes, new kinds included, and a healthy run each.
        q = {"cpp": [("host-hotspot", 4), ("kernel-regression", 4), ("io-stall/worker", 4), ("gpu-ecc", 4),
                     ("none", 4)],
             "py": [("host-hotspot", 4), ("none", 4)]}
        for fam in ("cpp", "py"):
            if fam not in families:
                continue
            for label, ranks in q[fam]:
                if not want(label):
                    continue
                if label == "none":
                    m.append(Case(fam, "none", "none", "", ranks, 1))
                else:
                    _, kind, opts = next(k for k in SIM_KINDS if k[0] == label)
                    m.append(Case(fam, label, kind, opts, ranks, 1))
        if "ddp" in families:
            v = DDP_SEEN[0]
            if want("host-hotspot"):
                m.append(Case("ddp", "host-hotspot", "host-hotspot", "ms=150", v[1], 1, v[0], v[2], v[3]))
            if want("none"):
                v = DDP_SEEN[1]
                m.append(Case("ddp", "none", "none", "", v[1], 1, v[0], v[2], v[3]))
        if "ddp-heldout" in families:
            for v in DDP_HELDOUT[:2]:
                if want("host-hotspot"):
                    m.append(Case("ddp-heldout", f"host-hotspot/{v[3]}", "host-hotspot", "ms=150", v[1], 1, v[0],
                                  v[2], v[3]))
            if want("none"):
                v = DDP_HELDOUT[0]
                m.append(Case("ddp-heldout", "none", "none", "", v[1], 1, v[0], v[2], v[3]))
        return m
    ranks = [int(x) for x in args.ranks.split(",")]
    for seed in range(args.first_seed, args.seeds + 1):
        for fam in ("cpp", "py"):
            if fam not in families:
                continue
            for n in ranks:
                for label, kind, opts in SIM_KINDS + [("none", "none", "")]:
                    if want(label) and not (fam == "py" and label in PY_SKIP):
                        flags = SIM_FLAGS.get(label, [])
                        m.append(Case(fam, label, kind, opts, n, seed, "memory-calls" if flags else None, flags))
                # A healthy job that makes memory calls every step: no finding either.
                if fam == "cpp" and want("none"):
                    m.append(Case(fam, "none", "none", "", n, seed, "memory-calls", MEMORY_CALLS_HEALTHY))
        for fam, variants in (("ddp", DDP_SEEN), ("ddp-heldout", DDP_HELDOUT)):
            if fam not in families:
                continue
            kinds = DDP_KINDS + (DDP_JOB_WIDE_KINDS if fam == "ddp" else [])
            for v in variants:
                for label, kind, opts in kinds + [("none", "none", "")]:
                    if kind == "host-hotspot":
                        label = f"host-hotspot/{v[3]}"
                    if want(label):
                        m.append(Case(fam, label, kind, opts, v[1], seed, v[0], v[2], v[3]))
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build", help="build dir with bin/strata-sim and the testbed")
    ap.add_argument("--strata", default=None, help="the strata binary (default: BUILD/bin/strata)")
    ap.add_argument("--quick", action="store_true", help="a dozen runs over every family (~15 min on a quiet machine)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=1,
                    help="run seeds FIRST_SEED..SEEDS (a later seed of a matrix whose first seeds ran before)")
    ap.add_argument("--keep", action="store_true", help="keep the recorded stores")
    ap.add_argument("--out", default="bench/results/diagnose_accuracy")
    ap.add_argument("--summarize", default=None, metavar="RESULTS.json",
                    help="print the table of an earlier run's results.json and exit")
    ap.add_argument("--rescore", default=None, metavar="DIR",
                    help="with --summarize: diagnose the stores a --keep run left in DIR again with this build (latency too)")
    ap.add_argument("--regate", default=None, metavar="DIR",
                    help="with --summarize: judge the fault's effect again from the stores a --keep run left in DIR "
                         "(no diagnosis; prints each run's measures)")
    ap.add_argument("--families", default=",".join(FAMILIES), help="workload families: " + ", ".join(FAMILIES))
    ap.add_argument("--ddp", action="store_true", help="the DDP families only (--families ddp,ddp-heldout)")
    ap.add_argument("--kinds", default=None,
                    help="only these rows, comma separated (a kind name takes all its variants; none: healthy)")
    ap.add_argument("--ranks", default="4,8", help="rank counts of strata-sim's families")
    ap.add_argument("--steps-4", dest="steps_4", type=int, default=150, help="steps of a strata-sim run of <= 4 ranks")
    ap.add_argument("--steps-8", dest="steps_8", type=int, default=90, help="steps of an 8-rank strata-sim run")
    ap.add_argument("--steps-ddp", dest="steps_ddp", type=int, default=150, help="steps of a DDP run")
    ap.add_argument("--list", action="store_true", help="print the runs of the matrix and exit")
    ap.add_argument("--only", help="only the runs whose name holds one of these comma-separated strings "
                    "(a matrix's part that did not run, say --only r4-w2)")
    ap.add_argument("--run-timeout", dest="run_timeout", type=int, default=900,
                    help="seconds a run may take before it is left out (default 900)")
    args = ap.parse_args()
    if args.ddp:
        args.families = "ddp,ddp-heldout"
    if args.summarize:
        results = json.load(open(args.summarize))
        for r in results:  # results of the single-family version of this script
            r.setdefault("family", ("ddp" if "-ddp-" in r["name"] else "py" if r.get("python") else "cpp"))
        if args.rescore:
            # The stores a --keep run left, diagnosed again by this build: the final store, and the
            # store cut at each window's end for the latency.
            strata = args.strata or os.path.join(args.build, "bin", "strata")
            scratch = tempfile.mkdtemp(prefix="strata-rescore-")
            for r in results:
                db = os.path.join(args.rescore, r["name"] + ".db")
                if os.path.exists(db):
                    dx = diagnose(strata, db)
                    r["findings"] = dx["findings"]
                    r["unexplained"] = dx.get("unexplained", [])
                    truth_path = os.path.join(args.rescore, r["name"] + ".json")
                    if r["kind"] != "none" and os.path.exists(truth_path):
                        r["latency_s"] = first_correct_latency(strata, db, json.load(open(truth_path)), scratch)
            shutil.rmtree(scratch, ignore_errors=True)
        gate_dir = args.regate or args.rescore
        if gate_dir:
            for r in results:
                db = os.path.join(gate_dir, r["name"] + ".db")
                truth_path = os.path.join(gate_dir, r["name"] + ".json")
                if r["kind"] == "none" or not (os.path.exists(db) and os.path.exists(truth_path)):
                    continue
                truth = json.load(open(truth_path))
                kind = r["spec"].split(":")[0]
                old = r.get("manifest")
                r["manifest"], r["effect"] = manifest(truth, kind, db, fault_start_ns(db, truth))
                print(f"{r['name']}: effect {effect_text(r)} (was {old})")
        summarize(results, sys.stdout, quiet=True)
        return
    args.strata = args.strata or os.path.join(args.build, "bin", "strata")
    if args.quick:
        args.steps_4 = min(args.steps_4, 110)
    matrix = build_matrix(args)
    if args.only:
        wanted = [w for w in args.only.split(",") if w]
        matrix = [c for c in matrix if any(w in c.name() for w in wanted)]
        if not matrix:
            raise SystemExit("diagnose_accuracy: no run of the matrix matches --only " + args.only)
    if args.list:
        for c in matrix:
            print(c.name(), c.kind, c.opts, " ".join(c.flags))
        return
    os.makedirs(args.out, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="strata-diag-acc-")
    results = []
    t0 = time.time()
    load0 = f"{os.getloadavg()[0]:.2f}"
    loads = []

    def write_summary(final):
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(results, f, indent=1)
        with open(os.path.join(args.out, "summary.txt"), "w") as out:
            done = "" if final else f", PARTIAL: {len(results)} of {len(matrix)} so far"
            mean_load = sum(loads) / len(loads) if loads else 0.0
            out.write(f"{len(results)} runs in {time.time() - t0:.0f} s ({'quick' if args.quick else 'full'}, "
                      f"families {args.families}{done}); load average at start {load0}, mean over runs "
                      f"{mean_load:.2f}, max {max(loads) if loads else 0.0:.2f} ({os.cpu_count()} CPUs)\n")
            summarize(results, out, quiet=not final)

    with open(os.path.join(args.out, "runs.log"), "w") as log:
        for i, c in enumerate(matrix):
            print(f"[{i + 1}/{len(matrix)}] {c.name()}", file=sys.stderr)
            r = one_run(args, c, workdir, log)
            loads.append(os.getloadavg()[0])
            if r:
                r["load_avg_1m"] = loads[-1]
                results.append(r)
            write_summary(False)  # a partial table survives an interrupted run
    write_summary(True)
    if args.keep:
        print("recorded stores kept in " + workdir, file=sys.stderr)
    else:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
