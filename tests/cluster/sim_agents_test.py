#!/usr/bin/env python3
"""`strata-sim agents` through a real `strata serve` (SQLite, with a token): 4 simulated nodes x 2
ranks whose processes have the same pids on every node (--same-pids, as in containers), rank 5
(node-2, local rank 1) with a slow GPU. The collector's diagnosis names rank 5 on node-2 with
gpu-slow (API and `strata diagnose --server`), and every rank's steps are its own: asked by (node,
pid), each rank has exactly the steps its agent shipped, though four nodes share each pid. Then a
healthy job: no finding. Under a minute.

usage: sim_agents_test.py BUILD_DIR
"""
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
from harness import check, failures, free_port, procs, start, wait_http  # noqa: E402

BUILD = os.path.abspath(sys.argv[1])
STRATA = os.path.join(BUILD, "bin", "strata")
SIM = os.path.join(BUILD, "bin", "strata-sim")
TOKEN = "sim-agents-" + os.urandom(6).hex()
# How long a diagnosis round may take to cover the last data on a loaded machine.
ROUND_TIMEOUT_S = 40


def get(base, path):
    req = urllib.request.Request(base + path, headers={"Authorization": "Bearer " + TOKEN})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def run_sim(tmp, base, job, fault):
    truth_path = os.path.join(tmp, job + ".truth.json")
    args = [SIM, "agents", "--server", base, "--token-file", os.path.join(tmp, "token"), "--nodes", "4",
            "--ranks-per-node", "2", "--steps", "100", "--step-ms", "100", "--window-s", "1", "--speed", "0",
            "--same-pids", "--job", job, "--truth", truth_path, "--quiet"]
    if fault:
        args += ["--fault", fault]
    res = subprocess.run(args, capture_output=True, text=True, timeout=120)
    print(res.stdout + res.stderr, end="")
    check(res.returncode == 0, "%s: strata-sim agents exits 0 (every batch acknowledged): %d" % (job, res.returncode))
    return json.load(open(truth_path))


def kept_after(base, job, after_ns):
    """The job's kept diagnosis from a round that began after after_ns (it saw all the data)."""
    end = time.time() + ROUND_TIMEOUT_S
    while time.time() < end:
        d = get(base, "/api/v1/findings?job=" + urllib.parse.quote(job))
        if d.get("kept", {}).get("diagnosed_ns", 0) > after_ns:
            return d
        time.sleep(0.5)
    return None


def main():
    tmp = tempfile.mkdtemp(prefix="strata-sim-agents-test-")
    with open(os.path.join(tmp, "token"), "w") as f:
        f.write(TOKEN + "\n")
    port = free_port()
    base = "http://127.0.0.1:%d" % port
    start([STRATA, "serve", "--store", "sqlite:" + os.path.join(tmp, "server.db"), "--listen", "127.0.0.1:%d" % port,
           "--token-file", os.path.join(tmp, "token"), "--diagnose-every", "1"], os.path.join(tmp, "serve.log"))
    if not check(wait_http(base + "/api/v1/jobs"), "strata serve answers"):
        return

    # -- the slow GPU of rank 5 (node 2, local rank 1), same pids on every node
    truth = run_sim(tmp, base, "slowgpu", "gpu-slow:node=2,local_rank=1")
    done_ns = time.time_ns()
    f = truth["fault"]
    check(f["rank"] == 5 and f["node"] == "node-2" and f["cause"] == "gpu-slow",
          "truth: rank 5 on node-2, cause gpu-slow: %s" % f)
    pids = {r["rank"]: r["pid"] for r in truth["per_rank"]}
    check(pids[1] == pids[3] == pids[5] == pids[7] and pids[0] == pids[2] == pids[4] == pids[6],
          "every node's ranks have the same pids: %s" % pids)
    ship = truth["shipping"]
    check(ship["rows_sealed"] == ship["rows_acknowledged"] and ship["rows_sealed"].get("steps") == 8 * 100,
          "every row the agents sealed was acknowledged, 800 steps: %s" % ship["rows_acknowledged"])

    # Each rank's steps are its own: (node, pid) names one process though every pid is on 4 nodes.
    for r in truth["per_rank"]:
        got = get(base, "/api/v1/steps?node=%s&pid=%d" % (r["node"], r["pid"]))["steps"]
        nums = sorted(s["step"] for s in got)
        check(len(got) == r["steps"] and nums == list(range(1, r["steps"] + 1)) and all(s["node"] == r["node"] for s in got),
              "rank %d (%s pid %d): %d steps, its own (want %d)" % (r["rank"], r["node"], r["pid"], len(got), r["steps"]))
    # ... and rank 5's steps are the slow ones, its node-mates' on other nodes not.
    def compute_ms(node, pid):
        got = get(base, "/api/v1/steps?node=%s&pid=%d" % (node, pid))["steps"]
        late = [s["device_compute_ns"] for s in got if s["step"] > 50]
        return sum(late) / len(late) / 1e6
    slow, peer = compute_ms("node-2", pids[5]), compute_ms("node-1", pids[3])
    check(slow > 1.5 * peer, "rank 5's GPU computes longer than rank 3's, same pid on node-1: %.1f vs %.1f ms" % (slow, peer))

    d = kept_after(base, "slowgpu", done_ns)
    if check(d is not None, "a diagnosis round after the last batch"):
        fs = d["findings"]
        top = fs[0] if fs else {}
        check(len(fs) == 1 and top.get("rank") == 5 and top.get("node") == "node-2" and top.get("cause") == "gpu-slow"
              and top.get("culprit") == truth["fault"]["culprit"],
              "one finding: rank 5 on node-2, gpu-slow, %s: %s" % (truth["fault"]["culprit"],
                                                                   [(x["rank"], x["node"], x["cause"], x["culprit"]) for x in fs]))
        check(d.get("ranks") == 8, "the diagnosis saw all 8 ranks: %s" % d.get("ranks"))
    cli = subprocess.run([STRATA, "diagnose", "--server", base, "--token-file", os.path.join(tmp, "token"),
                          "--job", "slowgpu"], capture_output=True, text=True, timeout=60)
    print(cli.stdout, end="")
    check(cli.returncode == 0 and "gpu-slow on rank 5" in cli.stdout and "node-2" in cli.stdout,
          "strata diagnose --server names gpu-slow on rank 5, node-2 (exit %d)" % cli.returncode)

    # -- a healthy job: no finding
    truth = run_sim(tmp, base, "healthy", None)
    done_ns = time.time_ns()
    d = kept_after(base, "healthy", done_ns)
    if check(d is not None, "healthy: a diagnosis round after the last batch"):
        check(d.get("healthy") is True and d["findings"] == [] and d.get("ranks") == 8,
              "healthy: no finding, 8 ranks: %s" % [(x["rank"], x["cause"]) for x in d["findings"]])


try:
    main()
finally:
    for p in procs:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
print("FAILED: %d check(s)" % len(failures) if failures else "PASSED")
sys.exit(1 if failures else 0)
