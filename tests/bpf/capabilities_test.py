#!/usr/bin/env python3
"""Least privilege for every thread (label bpf; root): a running `strata agent` and a running
`strata record` keep no capability outside the runtime set (agent/privileges.h) on any thread.
And the job comes first: every one of their threads runs at nice >= AGENT_NICE (agent/pipeline.cpp),
while the command `strata record` starts keeps the priority it was started with.

Capabilities are per thread: a thread started before the drop keeps everything root had. So this
reads CapInh, CapPrm, CapEff, CapBnd and CapAmb of every /proc/PID/task/*/status while the
programs run with all their threads -- the agent's shipper, its /metrics + /drilldown HTTP server
and the NVML poller (the testbed's libnvidia-ml stand-in, so that thread exists here too); the
recorder's NVML poller -- and fails if any set of any thread holds more than the runtime set, or
if the threads that must exist are not there (a check of fewer threads proves nothing).
Usage: capabilities_test.py BUILD_DIR
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
from harness import check, failures, free_port, scrape  # noqa: E402

B = os.path.abspath(sys.argv[1])
STRATA = os.path.join(B, "bin", "strata")
NVML = os.path.join(B, "testbed", "lib", "libnvidia-ml.so.1")
SETS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")
# The agent's threads: main loop, shipper, HTTP listener, NVML poller (httplib adds its workers).
AGENT_MIN_THREADS = 4
# The recorder's: main loop, NVML poller.
RECORD_MIN_THREADS = 2
# agent/pipeline.cpp's kAgentNice.
AGENT_NICE = 10


def runtime_set():
    """agent/privileges.h's runtime_capabilities(), as a bit mask."""
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    keep = [2, 19, 34]  # dac_read_search, sys_ptrace, syslog
    keep += [38, 39] if last >= 39 else [21]  # perfmon + bpf; sys_admin before Linux 5.8
    return sum(1 << c for c in keep)


def thread_sets(pid):
    """{tid: {set name: mask}} for every thread of pid (threads that exit meanwhile are skipped)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                sets = {}
                for line in f:
                    key, _, value = line.partition(":")
                    if key in SETS:
                        sets[key] = int(value.strip(), 16)
            out[int(tid)] = sets
        except FileNotFoundError:
            pass
    return out


def thread_nice(pid):
    """{tid: nice} for every thread of pid (field 19 of /proc/PID/task/TID/stat)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
            out[int(tid)] = int(stat[stat.rindex(")") + 2:].split()[16])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return out


def check_nice(name, pid):
    low = {tid: n for tid, n in thread_nice(pid).items() if n < AGENT_NICE}
    check(not low, f"{name}: every thread runs at nice >= {AGENT_NICE}" + (f": {low}" if low else ""))


def check_threads(name, pid, min_threads):
    want = runtime_set()
    threads = thread_sets(pid)
    check(len(threads) >= min_threads, f"{name}: {len(threads)} threads running (at least {min_threads} expected)")
    extra = []
    for tid, sets in sorted(threads.items()):
        for key in SETS:
            more = sets.get(key, 0) & ~want
            if more:
                extra.append(f"tid {tid} {key} {sets[key]:#x} (+{more:#x})")
    check(not extra, f"{name}: no thread holds a capability outside {want:#x}" + (": " + "; ".join(extra) if extra else ""))
    eff = {sets.get("CapEff", 0) for sets in threads.values()}
    check(eff == {want}, f"{name}: every thread's effective set is the runtime set ({sorted(hex(e) for e in eff)})")


def wait_metrics(port, proc, seconds=60):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        if scrape(port, timeout=2):
            return True
        time.sleep(0.2)
    return False


def wait_threads(pid, n, seconds=30):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and len(thread_sets(pid)) < n:
        time.sleep(0.2)


def main():
    if os.geteuid() != 0:
        print("FAIL needs root (the capability drop is what is tested)")
        return 1
    check(os.path.exists(NVML), f"the testbed's NVML stand-in is built ({NVML})")
    env = dict(os.environ, STRATA_NVML_LIBRARY=NVML)
    tmp = tempfile.mkdtemp(prefix="strata-caps-")
    try:
        # The agent, shipping to a collector that is not there: the shipper thread runs and retries.
        port, dead = free_port(), free_port()
        agent = subprocess.Popen([STRATA, "agent", "--server", f"http://127.0.0.1:{dead}", "--node", "caps-test",
                                  "--spool", os.path.join(tmp, "spool"), "--window", "1",
                                  "--listen-metrics", f"127.0.0.1:{port}"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        try:
            up = wait_metrics(port, agent)
            check(up, "agent: /metrics answers")
            if up:
                wait_threads(agent.pid, AGENT_MIN_THREADS)
                check_threads("agent", agent.pid, AGENT_MIN_THREADS)
                check_nice("agent", agent.pid)
        finally:
            agent.terminate()
            _, err = agent.communicate(timeout=60)
        check(agent.returncode == 0, f"agent: exit {agent.returncode} {err.strip()[-300:]}")

        # The recorder, around a command that runs long enough to look.
        db = os.path.join(tmp, "caps.db")
        rec = subprocess.Popen([STRATA, "record", "-o", db, "--window", "1", "--", "sleep", "6"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        try:
            # The NVML poller starts after the drop: once it is there, start-up is over.
            wait_threads(rec.pid, RECORD_MIN_THREADS)
            check_threads("record", rec.pid, RECORD_MIN_THREADS)
            check_nice("record", rec.pid)
            # Its command keeps this test's priority: strata lowers its own, never the job's.
            with open(f"/proc/{rec.pid}/task/{rec.pid}/children") as f:
                children = [int(c) for c in f.read().split()]
            check(len(children) == 1, f"record: one command running ({children})")
            mine = os.getpriority(os.PRIO_PROCESS, 0)
            for child in children:
                check(set(thread_nice(child).values()) == {mine},
                      f"record: its command runs at nice {mine} ({thread_nice(child)})")
        finally:
            _, err = rec.communicate(timeout=120)
        check(rec.returncode == 0, f"record: exit {rec.returncode} {err.strip()[-300:]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
