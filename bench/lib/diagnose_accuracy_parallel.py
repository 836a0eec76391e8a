#!/usr/bin/env python3
"""Accuracy of `strata diagnose` on pipeline/tensor-parallel testbed jobs (issue 18 items 1 and 5).

`strata-sim run --pp P --tp T --ranks N`: stages compute unequal shares by design, so a rank must be
compared with its own stage. Cases (CASES below, kept apart from diagnose_accuracy.py's matrix so
both lists merge without conflict): healthy runs, and gpu-slow / host-hotspot / workload-imbalance
on a random rank, at 4 ranks (pp=2 tp=2) and 8 ranks (pp=2 tp=2 dp=2, pp=4 tp=2), several seeds.
Scored as diagnose_accuracy.py scores (the same helpers): rank top-1, cause top-1, culprit named,
latency to the first correct finding with 10 s windows, false findings on healthy runs.
  sudo bench/diagnose_accuracy_parallel.sh [--quick] [--seeds N] [--build DIR] [--keep]
Results: bench/results/diagnose_accuracy_parallel/{summary.txt,results.json,runs.log}.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import diagnose_accuracy as acc  # noqa: E402  (run, diagnose, manifest, latency, summarize)

# (pp, tp, ranks): the layouts measured; ranks / (pp x tp) data-parallel replicas.
LAYOUTS = [(2, 2, 4), (2, 2, 8), (4, 2, 8)]
# Fault kinds on one rank of one stage, and healthy runs ("none").
KINDS = ["gpu-slow", "host-hotspot", "workload-imbalance", "none"]
# The cases of one seed: every layout x kind. --quick: 4-rank layout only.
CASES = [(k, layout) for layout in LAYOUTS for k in KINDS]
STEPS = {4: 120, 8: 90}  # two or three 10 s windows after the fault starts


def one_run(args, kind, layout, seed, workdir, log):
    pp, tp, ranks = layout
    rng = random.Random(f"{kind}/{pp}x{tp}x{ranks}/{seed}")
    rank = rng.randrange(ranks)
    start = rng.randrange(8, 15)
    spec = kind if kind == "none" else f"{kind}:rank={rank},start_step={start}"
    name = f"{kind}-pp{pp}tp{tp}r{ranks}-s{seed}"
    db = os.path.join(workdir, name + ".db")
    truth_path = os.path.join(workdir, name + ".json")
    sim = [os.path.join(args.build, "bin", "strata-sim"), "run", "--pp", str(pp), "--tp", str(tp), "--ranks",
           str(ranks), "--steps", str(STEPS[ranks]), "--fault", spec, "--seed", str(seed), "--truth", truth_path,
           "--hang-timeout", "25", "--quiet"]
    env = dict(os.environ)
    env["STRATA_NVML_LIBRARY"] = os.path.join(args.build, "testbed", "lib", "libnvidia-ml.so.1")
    # A stand-in GPU state of the run's own (as diagnose_accuracy.py): another strata-sim on this
    # machine maps the shared default, and its injected faults would show in this run.
    testbed_dir = os.path.join(workdir, "testbed-" + name)
    os.makedirs(testbed_dir, exist_ok=True)
    env["STRATA_TESTBED_DIR"] = testbed_dir
    t0 = time.time()
    try:
        r = acc.run([args.strata, "record", "--window", "10", "-o", db, "--"] + sim, env=env, timeout=900)
    except subprocess.TimeoutExpired:
        log.write(f"{name}: {spec}; did not finish in 900 s (load average {os.getloadavg()[0]:.1f}): left out\n")
        log.flush()
        shutil.rmtree(testbed_dir, ignore_errors=True)
        return None
    wall = time.time() - t0
    shutil.rmtree(testbed_dir, ignore_errors=True)
    if not os.path.exists(truth_path):
        log.write(f"{name}: no truth (record rc={r.returncode}): {r.stderr[-300:]}\n")
        return None
    truth = json.load(open(truth_path))
    dx = acc.diagnose(args.strata, db)
    # Scored by diagnose_accuracy.py's summarize, which reads its own records' keys: these runs are
    # its "cpp" family (strata-sim's C++ rank).
    res = {"name": name, "family": "cpp", "kind": kind, "variant": f"pp{pp}tp{tp}", "ranks": ranks, "pp": pp, "tp": tp,
           "python": False, "seed": seed, "spec": spec, "wall_s": wall, "findings": dx.get("findings", []),
           "error": dx.get("error"), "truth": truth["fault"],
           "manifest": acc.manifest(truth, kind) if kind != "none" else None, "latency_s": None}
    if kind != "none":
        res["latency_s"] = acc.first_correct_latency(args.strata, db, truth, workdir)
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--strata", default=None)
    ap.add_argument("--quick", action="store_true", help="one seed, the 4-rank layout only (~4 minutes)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--out", default="bench/results/diagnose_accuracy_parallel")
    args = ap.parse_args()
    args.strata = args.strata or os.path.join(args.build, "bin", "strata")
    seeds = [1] if args.quick else list(range(1, args.seeds + 1))
    cases = [c for c in CASES if not args.quick or c[1][2] == 4]
    matrix = [(k, layout, seed) for seed in seeds for k, layout in cases]
    os.makedirs(args.out, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="strata-diag-par-")
    results = []
    t0 = time.time()
    with open(os.path.join(args.out, "runs.log"), "w") as log:
        for i, (k, layout, seed) in enumerate(matrix):
            print(f"[{i + 1}/{len(matrix)}] {k} pp={layout[0]} tp={layout[1]} ranks={layout[2]} seed={seed}",
                  file=sys.stderr)
            r = one_run(args, k, layout, seed, workdir, log)
            if r:
                r["load_avg_1m"] = os.getloadavg()[0]
                results.append(r)
            with open(os.path.join(args.out, "results.json"), "w") as f:
                json.dump(results, f, indent=1)
    with open(os.path.join(args.out, "summary.txt"), "w") as out:
        out.write(f"{len(results)} pipeline/tensor-parallel runs in {time.time() - t0:.0f} s "
                  f"({'quick' if args.quick else 'full'})\n")
        # One table per layout ("on every workload family, not on average"), then all together.
        for pp, tp, ranks in LAYOUTS:
            subset = [r for r in results if (r["pp"], r["tp"], r["ranks"]) == (pp, tp, ranks)]
            if subset:
                out.write(f"\n-- pp={pp} tp={tp} ranks={ranks}\n")
                acc.summarize(subset, out, quiet=True)
        out.write("\n-- all layouts\n")
        acc.summarize(results, out, quiet=True)
    with open(os.path.join(args.out, "summary.txt")) as f:
        sys.stdout.write(f.read())
    if args.keep:
        print("recorded stores kept in " + workdir, file=sys.stderr)
    else:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
