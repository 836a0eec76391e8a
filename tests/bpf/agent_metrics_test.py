#!/usr/bin/env python3
"""The agent's /metrics follows Prometheus conventions (label bpf; root), as serve's does
(tests/unit/cli_test.cpp, Cli.ServeMetricsFollowPrometheusConventions).

A real `strata agent -o FILE.db --listen-metrics 127.0.0.1:PORT` watches a 2-rank strata-sim job;
its page, scraped while the job runs and after it ends, must have:
- HELP and TYPE before every family's samples, once each; `_total` on counters and only on them;
- strata_build_info{version=..., role="agent"} 1;
- each layer's stats as their own families (no strata_agent_source_stat{key=...}), every one
  described in agent/daemon/source_metrics.cpp, with live values (the job's probe hits counted).
Usage: agent_metrics_test.py BUILD_DIR
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
from harness import check, failures, free_port, metric, prometheus_problems, scrape  # noqa: E402

B = os.path.abspath(sys.argv[1])
STRATA = os.path.join(B, "bin", "strata")
SIM = os.path.join(B, "bin", "strata-sim")
UNDESCRIBED = "(not described in agent/daemon/source_metrics.cpp)"  # kUndescribedHelp


def check_page(what, page):
    problems = prometheus_problems(page)
    check(page != "" and not problems, "%s: Prometheus conventions hold (%d lines; problems: %s)"
          % (what, len(page.splitlines()), problems[:5]))
    check(re.search(r'^strata_build_info\{version="[^"]+",role="agent"\} 1$', page, re.M) is not None,
          what + ": strata_build_info with the version")
    check("source_stat" not in page, what + ": no strata_agent_source_stat gauge")
    undescribed = [l for l in page.splitlines() if UNDESCRIBED in l]
    check(not undescribed, what + ": every layer stat is described: %s" % undescribed[:3])


def main():
    if os.geteuid() != 0:
        raise SystemExit("agent_metrics_test needs root (BPF)")
    for f in (STRATA, SIM):
        if not os.path.exists(f):
            raise SystemExit("missing " + f + " (build strata and strata-sim)")
    with tempfile.TemporaryDirectory(prefix="strata-agent-metrics-") as tmp:
        port = free_port()
        tag = "STRATA_METRICS_TEST"
        agent = subprocess.Popen([STRATA, "agent", "-o", os.path.join(tmp, "agent.db"), "--window", "1",
                                  "--listen-metrics", "127.0.0.1:%d" % port, "--select", "%s=%d" % (tag, os.getpid())],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            page = ""
            for _ in range(600):
                page = scrape(port, timeout=2)
                if page or agent.poll() is not None:
                    break
                time.sleep(0.1)
            check(page != "", "the agent serves /metrics")
            check_page("idle agent", page)
            # A second agent on the same metrics port refuses to start (exit 2), as a second
            # strata serve does: sharing it (httplib's SO_REUSEPORT) split scrapes between the two.
            try:
                second = subprocess.run([STRATA, "agent", "-o", os.path.join(tmp, "second.db"), "--listen-metrics",
                                         "127.0.0.1:%d" % port, "--select", "%s=none" % tag],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
                # In strata serve's words: "cannot listen on ADDR: address in use (...)".
                check(second.returncode == 2
                      and ("cannot listen on 127.0.0.1:%d: address in use (" % port) in second.stderr,
                      "a second agent on the taken metrics port exits 2 (%d), saying 'address in use' as serve does: %s"
                      % (second.returncode, second.stderr.strip()[-300:]))
                check(not os.path.exists(os.path.join(tmp, "second.db")), "the refused agent left no store file")
            except subprocess.TimeoutExpired:
                check(False, "a second agent on the taken metrics port exits 2 (it was still running after 60 s)")
            env = dict(os.environ)
            env[tag] = str(os.getpid())
            sim = subprocess.run([SIM, "run", "--ranks", "2", "--steps", "60", "--quiet"], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
            check(sim.returncode == 0, "the sim job ran: " + sim.stderr[-500:])
            time.sleep(3)  # a window or two closes and the page is rebuilt (about once a second)
            page = scrape(port)
            check_page("after a job", page)
            samples = metric(page, "strata_agent_samples_total")
            entries = metric(page, "strata_agent_gpu_comm_probe_entries_total")
            check(samples is not None and samples > 0, "on-CPU samples counted: %s" % samples)
            check(entries is not None and entries > 0, "the GPU/communication layer's probe entries counted: %s"
                  % entries)
        finally:
            agent.send_signal(signal.SIGTERM)
            out, err = agent.communicate(timeout=60)
        check(agent.returncode == 0, "the agent exits 0 on SIGTERM: %s" % err[-1000:])
    if failures:
        print("%d check(s) failed" % len(failures), flush=True)
        sys.exit(1)
    print("all agent /metrics checks passed")


if __name__ == "__main__":
    main()
