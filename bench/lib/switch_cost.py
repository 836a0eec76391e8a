#!/usr/bin/env python3
"""The agent's BPF run time per program (runs, ns a run) on the sim job, for two builds side by side
(bench/README.md "switch_cost.sh").

usage: switch_cost.py BUILD_A BUILD_B [--seconds S] [--warmup W] [--rounds N] [--args-a "..."] [--args-b "..."]

Each round runs one `strata-sim run --ranks 4` watched by two agents at once, one of each build
(each shipping to its own `strata serve`), and reads each agent's per-program BPF stats
(kernel.bpf_stats_enabled) over S seconds after W seconds of warm-up. Both programs run at the same
context switches under the same load: on this shared machine ns a run drifts 20% within minutes with
the load, far more than a change to the program, so runs one after the other cannot compare them.
The agents start A then B, then B then A in the next round (the program attached second may find
caches warmed by the first). Only the agents run beside the job (not `strata record` or bpftrace, as
agent_cost.sh does). --args-a/--args-b add arguments to one agent (BUILD_A and BUILD_B may then
be the same build: `--args-b "--layers cpu,os,gpu,comm"` weighs what the offcpu layer's stack captures
add; leading NAME=VALUE words set that agent's environment: `--args-b STRATA_OFFCPU_CAPTURE_TARGET=100`
weighs a lower capture target). Needs root.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import agent_cost as ac  # noqa: E402
from process_group import stop_group  # noqa: E402


def run_together(builds, extra, args, tmp, tag):
    """One job watched by one agent of each build at once, started in the order of `builds`: both
    programs run at the same switches under the same load. Per agent, in that order: {program: (runs,
    ns a run)}."""
    marker = os.urandom(6).hex()
    wdir = os.path.join(tmp, tag)
    os.makedirs(wdir)
    first = builds[0]
    node_env = {k: v for k, v in os.environ.items() if k not in ("CUDA_INJECTION64_PATH", "STRATA_TIMELINE_DIR")}
    node_env.update(STRATA_NVML_LIBRARY=os.path.join(first, "testbed", "lib", "libnvidia-ml.so.1"),
                    STRATA_TESTBED_DIR=os.path.join(wdir, "testbed"))
    os.makedirs(node_env["STRATA_TESTBED_DIR"])
    env = dict(node_env)
    env.update(ac.pod_env(os.path.join(first, "bin", "strata")))
    env["STRATA_BENCH"] = marker
    procs, logs, agents = {}, [], {}

    def start(key, cmd, **kw):
        logs.append(open(os.path.join(wdir, key + ".log"), "w"))
        procs[key] = subprocess.Popen(cmd, stdout=logs[-1], stderr=subprocess.STDOUT, start_new_session=True, **kw)
        return procs[key]

    try:
        for i, build in enumerate(builds):
            strata = os.path.join(build, "bin", "strata")
            port = ac.free_port()
            serve = start("serve%d" % i, [strata, "serve", "--store", "sqlite:" + os.path.join(wdir, "serve%d.db" % i),
                                          "--listen", "127.0.0.1:%d" % port])
            if not ac.settle(serve.pid, False):
                raise RuntimeError("strata serve did not start")
            # Leading NAME=VALUE words of --args-a/--args-b go to that agent's environment.
            words = extra[i].split()
            agent_env = dict(node_env)
            while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
                name, value = words.pop(0).split("=", 1)
                agent_env[name] = value
            agent = start("agent%d" % i, [strata, "agent", "--server", "http://127.0.0.1:%d" % port, "--select",
                                          "STRATA_BENCH=" + marker, "--window", "10", "--listen-metrics", "off",
                                          "--budget", "0",  # no cost budget: each agent's own steps down
                                          # (capture rate, sampling rate) would come at its own times
                                          "--spool", os.path.join(wdir, "spool%d" % i)] + words,
                          env=agent_env)
            if not ac.settle(agent.pid, True):
                raise RuntimeError("strata agent did not start: " +
                                   open(os.path.join(wdir, "agent%d.log" % i)).read()[-400:])
            agents[i] = agent
        start("job", ac.workload_cmd("sim", first), env=env, cwd=ac.SOURCE)
        t0 = time.time()
        while len(ac.rank_pids(marker)) < 4 and time.time() - t0 < 120:
            time.sleep(1)
        time.sleep(args.warmup)
        before = {i: ac.bpf_by_name(a.pid) for i, a in agents.items()}
        time.sleep(args.seconds)
        after = {i: ac.bpf_by_name(a.pid) for i, a in agents.items()}
        for k, p in procs.items():
            if p.poll() is not None:
                raise RuntimeError("%s exited during the run" % k)
    finally:
        for key in ["job"] + [k for k in procs if k != "job"]:
            stop_group(procs.get(key), signal.SIGINT if key != "job" else signal.SIGTERM)
        for f in logs:
            f.close()
    out = []  # per agent, in the order of builds
    for i in range(len(builds)):
        out.append({})
        for name, (cnt, ns) in after[i].items():
            c0, n0 = before[i].get(name, (0, 0))
            if cnt > c0:
                out[i][name] = (cnt - c0, (ns - n0) / (cnt - c0))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build_a")
    ap.add_argument("build_b")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--warmup", type=float, default=10)
    ap.add_argument("--rounds", type=int, default=1, help="rounds: A started first, then B, ... (default 1)")
    ap.add_argument("--args-a", default="", help="more arguments for A's agent (leading NAME=VALUE words: its environment)")
    ap.add_argument("--args-b", default="", help="more arguments for B's agent (leading NAME=VALUE words: its environment)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("switch_cost: needs root (BPF)", file=sys.stderr)
        return 2
    stats_path = "/proc/sys/kernel/bpf_stats_enabled"
    old_stats = open(stats_path).read().strip()
    tmp = tempfile.mkdtemp(prefix="strata-switch-cost-")
    builds = {"A": os.path.abspath(args.build_a), "B": os.path.abspath(args.build_b)}
    runs = []
    try:
        with open(stats_path, "w") as f:
            f.write("1")
        for r in range(args.rounds):
            order = "AB" if r % 2 == 0 else "BA"
            extra = {"A": args.args_a, "B": args.args_b}
            got = run_together([builds[t] for t in order], [extra[t] for t in order], args, tmp, "%s%d" % (order, r))
            res = dict(zip(order, got))
            for t in order:
                runs.append((t, res[t]))
                print("%s (started %s of 2) %s load %.1f: %s" % (
                    t, "first" if t == order[0] else "second", time.strftime("%H:%M:%S"), os.getloadavg()[0],
                    ", ".join("%s %d runs x %.0f ns" % (n, c, ns)
                              for n, (c, ns) in sorted(res[t].items(), key=lambda kv: -kv[1][0] * kv[1][1]))),
                    flush=True)
    finally:
        with open(stats_path, "w") as f:
            f.write(old_stats)
    for tag in "AB":
        rs = [res.get("on_switch") for t, res in runs if t == tag and res.get("on_switch")]
        if rs:
            print("%s on_switch: %s ns a run (runs: %s)" % (tag, ", ".join("%.0f" % ns for _, ns in rs),
                                                            ", ".join(str(c) for c, _ in rs)))
    # Per round B's ns over A's; their geometric mean over rounds of both orders cancels the order.
    ratios = []
    for i in range(0, len(runs) - 1, 2):
        by = dict(runs[i:i + 2])
        if by.get("A", {}).get("on_switch") and by.get("B", {}).get("on_switch"):
            ratios.append(by["B"]["on_switch"][1] / by["A"]["on_switch"][1])
    if ratios:
        gm = 1.0
        for r in ratios:
            gm *= r
        print("on_switch B/A per round: %s; geometric mean %.3f" % (", ".join("%.3f" % r for r in ratios),
                                                                    gm ** (1 / len(ratios))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
