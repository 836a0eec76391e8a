#!/usr/bin/env python3
"""Accuracy of `strata diagnose` on the testbed's fault suite (bench/diagnose_accuracy.sh).

Every fault kind on random ranks with several seeds, plus healthy runs, at 4 and 8 ranks, with the C++
and the Python rank programs. Each run is recorded with `strata record --window 10`; the final store
is diagnosed and scored against the sim's truth JSON, and the store cut at each window's end (what
`strata serve` would have had then) is diagnosed too, to measure the time from the fault's start to
the first correct finding.

Runs are sequential (a 2-core machine): one run at a time, nothing else in parallel.
"""
import argparse
import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

KINDS = ["cpu-contention", "cpu-throttling", "memory-reclaim", "io-stall", "host-hotspot",
         "gpu-slow", "network-slow", "hang", "workload-imbalance"]


def run(cmd, env=None, timeout=600):
    return subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout)


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
    """When the fault began: the start of the culprit's first faulty step (steps count from 1)."""
    f = truth["fault"]
    pid = truth["pids"].get(str(f["rank"]))
    if pid is None:
        return None
    con = sqlite3.connect(db)
    row = con.execute("SELECT start_ns FROM steps WHERE pid = ? AND step = ?", (pid, f["start_step"] + 1)).fetchone()
    con.close()
    return row[0] if row else None


def correct(finding, truth):
    f = truth["fault"]
    return finding["rank"] == f.get("rank") and finding["cause"] == f.get("cause")


def manifest(truth):
    """Did the fault slow the job at all? (memory pressure may not, on a given machine)"""
    slow, base = [], []
    for r in truth["per_rank"]:
        if r.get("fault_window") and r.get("baseline"):
            slow.append(r["fault_window"]["step_ms"])
            base.append(r["baseline"]["step_ms"])
    if truth["fault"]["kind"] == "hang":
        return True
    if not slow:
        return False
    return statistics.median(slow) >= 1.05 * statistics.median(base)


# PyTorch DDP (gloo, CPU; testbed/workloads/ddp_train.py under Debian's python3): the faults that
# apply to a CPU job, each sized to stand out on a shared 2-core machine.
DDP_KINDS = ["host-hotspot", "workload-imbalance", "cpu-contention", "cpu-throttling", "network-slow"]
DDP_PARAMS = {"host-hotspot": "ms=150", "workload-imbalance": "factor=3", "cpu-contention": "hogs=2",
              "cpu-throttling": "quota_pct=10", "network-slow": "rate_mbit=40"}


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


def one_run(args, kind, ranks, python, seed, workdir, log):
    # A string seed: reproducible across runs (tuple hashes are salted per process).
    rng = random.Random(f"{kind}/{ranks}/{python}/{seed}" + ("/ddp" if args.ddp else ""))
    rank = rng.randrange(ranks)
    start = rng.randrange(8, 15)
    steps = args.steps_4 if ranks == 4 else args.steps_8
    spec = kind if kind == "none" else f"{kind}:rank={rank},start_step={start}"
    name = f"{kind}-r{ranks}-{'ddp' if args.ddp else 'py' if python else 'cpp'}-s{seed}"
    db = os.path.join(workdir, name + ".db")
    truth_path = os.path.join(workdir, name + ".json")
    if args.ddp:
        if kind != "none":
            spec += "," + DDP_PARAMS[kind]
        sim = ["/usr/bin/python3", "testbed/workloads/ddp_train.py", "--ranks", str(ranks), "--steps", str(steps),
               "--fault", spec, "--truth", truth_path]
    else:
        sim = [os.path.join(args.build, "bin", "strata-sim"), "run", "--ranks", str(ranks), "--steps", str(steps),
               "--fault", spec, "--seed", str(seed), "--truth", truth_path, "--hang-timeout", "25", "--quiet"]
    if python and not args.ddp:
        sim.append("--python")
    env = dict(os.environ)
    env["STRATA_NVML_LIBRARY"] = os.path.join(args.build, "testbed", "lib", "libnvidia-ml.so.1")
    t0 = time.time()
    r = run([args.strata, "record", "--window", "10", "-o", db, "--"] + sim, env=env, timeout=900)
    wall = time.time() - t0
    if not os.path.exists(truth_path):
        log.write(f"{name}: no truth (record rc={r.returncode}): {r.stderr[-300:]}\n")
        return None
    truth = json.load(open(truth_path))
    dx = diagnose(args.strata, db)
    res = {"name": name, "kind": kind, "ranks": ranks, "python": python, "seed": seed, "wall_s": wall,
           "findings": dx.get("findings", []), "error": dx.get("error"), "truth": truth["fault"],
           "manifest": manifest(truth) if kind != "none" else None, "latency_s": None}
    if kind != "none":
        res["latency_s"] = first_correct_latency(args.strata, db, truth, workdir)
    top = res["findings"][0] if res["findings"] else None
    tf = truth["fault"]
    log.write(f"{name}: truth rank {tf.get('rank')} {tf.get('cause')} ({tf.get('culprit')}); "
              f"got {json.dumps(top) if top else 'healthy'}; latency {res['latency_s']}; {wall:.0f} s\n")
    log.flush()
    if not args.keep:
        for p in (db, db + "-wal", db + "-shm"):
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


def summarize(results, out, quiet=False):
    lines = []
    hdr = (f"{'kind':<20} {'runs':>4} {'no-eff':>6} {'rank@1':>7} {'cause@1':>7} {'culprit':>7} "
           f"{'lat p50':>7} {'lat p90':>7}  (latency: fault start -> first correct finding, 10 s windows)")
    lines.append(hdr)
    tot = {"n": 0, "rank": 0, "cause": 0}
    for kind in KINDS:
        rs = [r for r in results if r["kind"] == kind]
        if not rs:
            continue
        eff = [r for r in rs if r["manifest"]]
        noeff = len(rs) - len(eff)
        rk = sum(1 for r in eff if r["findings"] and r["findings"][0]["rank"] == r["truth"]["rank"])
        ca = sum(1 for r in eff if r["findings"] and r["findings"][0]["cause"] == r["truth"]["cause"])
        cu = sum(1 for r in eff if r["findings"] and
                 r["truth"]["culprit"].lower() in r["findings"][0]["culprit"].lower())
        lats = [r["latency_s"] for r in eff if r["latency_s"] is not None]
        p50 = f"{statistics.median(lats):6.1f}s" if lats else "      -"
        p9 = f"{p90(lats):6.1f}s" if lats else "      -"
        lines.append(f"{kind:<20} {len(rs):>4} {noeff:>6} {pct(rk, len(eff)):>7} {pct(ca, len(eff)):>7} "
                     f"{pct(cu, len(eff)):>7} {p50:>7} {p9:>7}")
        tot["n"] += len(eff)
        tot["rank"] += rk
        tot["cause"] += ca
    lines.append(f"{'all (with effect)':<20} {tot['n']:>4} {'':>6} {pct(tot['rank'], tot['n']):>7} "
                 f"{pct(tot['cause'], tot['n']):>7}")
    healthy = [r for r in results if r["kind"] == "none"]
    # On a shared machine a healthy job can really be slowed by another process on its CPUs; a
    # finding that names such a process (not the testbed's own hog) is told apart, not hidden.
    def interference(f):
        return f["cause"] == "cpu-contention" and f["culprit"] != "strata-hog"
    false = sum(1 for r in healthy if r["findings"] and not interference(r["findings"][0]))
    real = [r["findings"][0]["culprit"] for r in healthy if r["findings"] and interference(r["findings"][0])]
    extra = (f" (+{len(real)} naming a foreign process on the job's CPUs: {', '.join(sorted(set(real)))})"
             if real else "")
    lines.append(f"{'healthy (none)':<20} {len(healthy):>4} runs, false findings: {false}{extra}")
    allat = [r["latency_s"] for r in results if r.get("latency_s") is not None]
    if allat:
        lines.append(f"time to first correct finding over all kinds: p50 {statistics.median(allat):.1f} s, "
                     f"p90 {p90(allat):.1f} s ({len(allat)} runs)")
    text = "\n".join(lines)
    if not quiet:
        print(text)
    out.write(text + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build", help="build dir with bin/strata-sim and the testbed")
    ap.add_argument("--strata", default=None, help="the strata binary (default: BUILD/bin/strata)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="keep the recorded stores")
    ap.add_argument("--out", default="bench/results/diagnose_accuracy")
    ap.add_argument("--summarize", default=None, metavar="RESULTS.json",
                    help="print the table of an earlier run's results.json and exit")
    ap.add_argument("--rescore", default=None, metavar="DIR",
                    help="with --summarize: diagnose the stores a --keep run left in DIR again with this build (latency too)")
    ap.add_argument("--ddp", action="store_true",
                    help="PyTorch DDP (gloo, CPU) instead of strata-sim: " + ", ".join(DDP_KINDS) + " and healthy runs")
    ap.add_argument("--kinds", default=None, help="only these fault kinds, comma separated (none: healthy)")
    ap.add_argument("--ranks", default="4,8", help="rank counts of the full matrix")
    ap.add_argument("--langs", default="cpp,py", help="rank programs of the full matrix: cpp, py")
    ap.add_argument("--steps-4", dest="steps_4_opt", type=int, default=None, help="steps of a 4-rank run (default 150, quick 110)")
    ap.add_argument("--steps-8", dest="steps_8_opt", type=int, default=None, help="steps of an 8-rank run (default 90)")
    args = ap.parse_args()
    if args.summarize:
        results = json.load(open(args.summarize))
        if args.rescore:
            # The stores a --keep run left, diagnosed again by this build: the final store, and the
            # store cut at each window's end for the latency.
            strata = args.strata or os.path.join(args.build, "bin", "strata")
            scratch = tempfile.mkdtemp(prefix="strata-rescore-")
            for r in results:
                db = os.path.join(args.rescore, r["name"] + ".db")
                if os.path.exists(db):
                    r["findings"] = diagnose(strata, db)["findings"]
                    truth_path = os.path.join(args.rescore, r["name"] + ".json")
                    if r["kind"] != "none" and os.path.exists(truth_path):
                        r["latency_s"] = first_correct_latency(strata, db, json.load(open(truth_path)), scratch)
            shutil.rmtree(scratch, ignore_errors=True)
        summarize(results, sys.stdout, quiet=True)
        return
    args.strata = args.strata or os.path.join(args.build, "bin", "strata")
    # Enough steps for two or three 10 s windows after the fault starts.
    args.steps_4 = 150
    args.steps_8 = 90
    kinds = args.kinds.split(",") if args.kinds else (DDP_KINDS if args.ddp else KINDS) + ["none"]
    if args.ddp:
        # One rank program (Python); 4 ranks on a 2-core machine; --quick: each kind once + 2 healthy.
        args.steps_4 = args.steps_4_opt or 150
        args.steps_8 = args.steps_8_opt or 100
        if args.out == ap.get_default("out"):
            args.out = "bench/results/diagnose_accuracy_ddp"
        if args.quick:
            matrix = [(k, 4, True, 1) for k in kinds if k != "none"] + [("none", 4, True, s) for s in (1, 2)]
        else:
            matrix = [(k, n, True, seed) for seed in range(1, args.seeds + 1)
                      for n in [int(x) for x in args.ranks.split(",")] for k in kinds]
    elif args.quick:
        matrix = [(k, 4, False, 1) for k in KINDS] + [("none", 4, False, 1), ("none", 4, True, 1)]
        matrix = [m for m in matrix if m[0] in kinds]
        args.steps_4 = 110
    else:
        matrix = []
        for seed in range(1, args.seeds + 1):
            for ranks in [int(x) for x in args.ranks.split(",")]:
                for python in [lang == "py" for lang in args.langs.split(",")]:
                    for k in kinds:
                        matrix.append((k, ranks, python, seed))
    if args.steps_4_opt and not args.ddp:
        args.steps_4 = args.steps_4_opt
    if args.steps_8_opt and not args.ddp:
        args.steps_8 = args.steps_8_opt
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
            out.write(f"{len(results)} runs in {time.time() - t0:.0f} s ({'quick' if args.quick else 'full'}"
                      f"{', PyTorch DDP gloo' if args.ddp else ''}{done}); load average at start {load0}, "
                      f"mean over runs {mean_load:.2f} ({os.cpu_count()} CPUs)\n")
            summarize(results, out, quiet=not final)

    with open(os.path.join(args.out, "runs.log"), "w") as log:
        for i, (k, n, py, seed) in enumerate(matrix):
            print(f"[{i + 1}/{len(matrix)}] {k} ranks={n} {'python' if py else 'c++'} seed={seed}", file=sys.stderr)
            r = one_run(args, k, n, py, seed, workdir, log)
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
