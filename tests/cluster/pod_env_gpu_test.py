#!/usr/bin/env python3
"""GPU device time in the agent, through the collector (label cluster; root: the agent uses BPF).

A launcher starts a 4-rank sim job with the environment `strata agent --pod-env` prints (the CUPTI
injection and the timeline directory, as a pod spec would give every training container). The
agent never started the job: it finds the ranks by their environment, reads each rank's device
timeline, and ships to `strata serve`. Rank 2's GPU gets slower from step 60. Checked:
  - the agent shipped device time (every step's device split, kernel time by name), per rank;
  - the collector's own diagnosis (its rounds, /api/v1/findings) names rank 2, gpu-slow, on the GPU
    layer, and nobody else;
  - the same job launched *without* that environment has no device time, and the agent says so
    in its health (the GPU layer degraded to NVML + launch->sync times), never silently.
Usage: pod_env_gpu_test.py BUILD_DIR
"""
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
from harness import check, failures, free_port, http, start, stop_all, wait_http  # noqa: E402

BUILD = os.path.abspath(sys.argv[1])
STRATA = os.path.join(BUILD, "bin", "strata")
SIM = os.path.join(BUILD, "bin", "strata-sim")
CULPRIT = 2
# 60 healthy steps: at least two whole 5 s windows before the fault however loaded the machine is
# (at 30 the first windows held start-up and the fault's first steps on a loaded machine, and the
# collector had no healthy stretch to call the rest slower than); then several windows of the fault.
FAULT_STEP = 60
STEPS = 160  # ~35-50 s


def pod_env():
    """What a pod spec would set, as printed (its host paths are mounted at the same paths)."""
    out = subprocess.run([STRATA, "agent", "--pod-env"], capture_output=True, text=True, check=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line and not line.startswith("#"))


def rows(db, sql):
    con = sqlite3.connect("file:" + db + "?mode=ro", uri=True, timeout=30)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def run_job(tmp, name, url, extra_env, fault, sim_args=("--steps", str(STEPS))):
    """Starts an agent for this job's marker, runs the job, stops the agent; returns the agent's log."""
    marker = os.urandom(5).hex()
    log = os.path.join(tmp, "agent-%s.log" % name)
    # The node's driver (the stand-in NVML over this run's stand-in GPUs), for the agent and the job.
    node_env = {k: v for k, v in os.environ.items() if k not in ("CUDA_INJECTION64_PATH", "STRATA_TIMELINE_DIR")}
    node_env.update(STRATA_NVML_LIBRARY=os.path.join(BUILD, "testbed", "lib", "libnvidia-ml.so.1"),
                    STRATA_TESTBED_DIR=os.path.join(tmp, "testbed-" + name))
    os.makedirs(node_env["STRATA_TESTBED_DIR"])
    agent = start([STRATA, "agent", "--server", url, "--node", "gpu-node", "--window", "5", "--select",
                   "STRATA_POD_TEST=" + marker, "--spool", os.path.join(tmp, "spool-" + name), "--listen-metrics", "off"],
                  log, env=node_env)
    time.sleep(2)
    env = dict(node_env, STRATA_POD_TEST=marker, STRATA_SIM_STARTUP_MS="3000")
    env.update(extra_env)
    sim = subprocess.run([SIM, "run", "--ranks", "4", *sim_args, "--quiet", "--fault", fault,
                          "--truth", os.path.join(tmp, name + ".json")], env=env, capture_output=True, text=True,
                         timeout=300)
    check(sim.returncode == 0, "%s: the sim job ran (rc %d %s)" % (name, sim.returncode, sim.stderr[-300:]))
    time.sleep(12)  # the last windows close and ship
    agent.send_signal(signal.SIGTERM)
    agent.wait(60)
    return open(log).read()


def job_of(url, db, pids):
    """The job name of the ranks with these pids (from the store)."""
    got = rows(db, "SELECT DISTINCT job FROM processes WHERE pid IN (%s) AND rank >= 0" % ",".join(map(str, pids)))
    return got[0][0] if got else ""


def main():
    if os.geteuid() != 0:
        raise SystemExit("pod_env_gpu_test needs root (BPF)")
    tmp = tempfile.mkdtemp(prefix="strata-podenv-")
    db = os.path.join(tmp, "serve.db")
    port = free_port()
    url = "http://127.0.0.1:%d" % port
    try:
        serve = start([STRATA, "serve", "--store", "sqlite:" + db, "--listen", "127.0.0.1:%d" % port,
                       "--diagnose-every", "2"], os.path.join(tmp, "serve.log"))
        check(wait_http(url + "/metrics", 30), "strata serve listens")

        # -- with the pod environment: device timelines, and the collector finds the slow GPU
        run_job(tmp, "pod", url, pod_env(), "gpu-slow:rank=%d,start_step=%d" % (CULPRIT, FAULT_STEP))
        truth = json.load(open(os.path.join(tmp, "pod.json")))
        pids = {int(r): p for r, p in truth["pids"].items()}
        # The agent ships device time as each step's device split and per-kernel metrics (not the
        # raw activity rows, which `strata record` keeps).
        per_rank = {r: rows(db, "SELECT SUM(device_known), COUNT(*) FROM steps WHERE pid = %d" % p)[0]
                    for r, p in pids.items()}
        check(all(k and k == n for k, n in per_rank.values()),
              "the agent read every rank's device timeline: steps with device time / steps %s" % per_rank)
        kernels = rows(db, "SELECT COUNT(*) FROM metrics WHERE name = 'gpu.kernel_us' AND pid IN (%s)" %
                       ",".join(map(str, pids.values())))[0][0]
        check(kernels > 0, "and kernel time per kernel name (%d gpu.kernel_us rows)" % kernels)
        job = job_of(url, db, pids.values())
        found = {}
        for _ in range(60):  # the collector's rounds run every 2 s; give the last one time
            status, body = http("GET", url + "/api/v1/findings?job=" + job)
            found = json.loads(body) if status == 200 else {}
            if any(f.get("cause") == "gpu-slow" for f in found.get("findings", [])):
                break
            time.sleep(1)
        findings = found.get("findings", [])
        top = findings[0] if findings else {}
        check(top.get("rank") == CULPRIT and top.get("cause") == "gpu-slow" and top.get("layer") == "gpu",
              "the collector finds gpu-slow on rank %d: %s" % (CULPRIT, json.dumps(findings)[:500]))
        check(all(f.get("rank") in (CULPRIT, -1, None) for f in findings), "no other rank is blamed")

        # -- without it: no device time, said in the agent's health. (Without the injection nothing
        # writes a timeline where the agent looks; the stand-in runtime publishes one whenever it
        # runs, so here it publishes it elsewhere, which the agent sees the same way.)
        elsewhere = os.path.join(tmp, "not-the-rendezvous")
        os.makedirs(elsewhere)
        # The agent waits 30 s (kTimelineGraceNs: CUDA start-up and a first kernel take seconds) before
        # it calls a GPU process timeline-less: this job runs longer than that whatever the machine's
        # speed (its modeled kernels alone take ~200 ms per step at --scale 2).
        log = run_job(tmp, "bare", url, {"STRATA_TIMELINE_DIR": elsewhere}, "none",
                      ("--steps", "200", "--scale", "2"))
        truth = json.load(open(os.path.join(tmp, "bare.json")))
        pids = [p for p in truth["pids"].values()]
        known, n = rows(db, "SELECT SUM(device_known), COUNT(*) FROM steps WHERE pid IN (%s)" % ",".join(map(str, pids)))[0]
        check(n > 0 and known == 0, "launched without the pod environment: no step has device time (%s of %d)" % (known, n))
        check("timeline" in log and ("no device timeline" in log or "degraded" in log),
              "the agent says the GPU layer has no device timeline: %s" %
              [l for l in log.splitlines() if "timeline" in l][:3])
        serve.send_signal(signal.SIGTERM)
        serve.wait(30)
    finally:
        stop_all()
    if failures:
        print("FAILED: %d check(s); logs in %s" % (len(failures), tmp))
        return 1
    subprocess.run(["rm", "-rf", tmp])
    print("all ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
