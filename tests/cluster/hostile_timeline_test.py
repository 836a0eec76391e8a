#!/usr/bin/env python3
"""A root `strata agent` watching processes that leave hostile GPU timelines (label cluster; root).

The agent's rendezvous (STRATA_TIMELINE_DIR, a private root-owned 01777 directory here) holds, for
six watched processes: a FIFO; a symbolic link to /etc/shadow; a header with capacity 0; a header
with capacity 2^32-1; a valid timeline that its writer truncates after the agent has started
reading it (and then keeps bumping its write index); and one good timeline as a control. The
agent must keep running and keep shipping to `strata serve`: it neither hangs on the FIFO, nor
dies of SIGBUS on the truncated file or SIGFPE on capacity 0, nor reads /etc/shadow; and it still
reads the good timeline (its kernel shows in the collector's store).

usage: hostile_timeline_test.py BUILD_DIR
"""
import os
import signal
import sqlite3
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
from harness import check, finish, free_port, metric, scrape, start, stop_all  # noqa: E402

BUILD = os.path.abspath(sys.argv[1])
STRATA = os.path.join(BUILD, "bin", "strata")

# abi/gpu_timeline.h
MAGIC = 0x454E494C454D4954
HEADER = struct.Struct("<QIIIIiIQQ")  # magic version header_size record_size capacity pid clock write_index start
RECORD = struct.Struct("<QIiQQQQQQQQiI96s")
HEADER_SIZE = 4096
assert RECORD.size == 184

# The watched processes: each writes (or places) its own <pid>.timeline, then lives on.
WRITER = r'''
import os, struct, sys, time
kind, d = sys.argv[1], sys.argv[2]
HEADER = struct.Struct("<QIIIIiIQQ"); RECORD = struct.Struct("<QIiQQQQQQQQiI96s")
pid = os.getpid(); path = os.path.join(d, "%d.timeline" % pid)
def header(capacity, index):
    return HEADER.pack(0x454E494C454D4954, 1, 4096, 184, capacity, pid, 1, index, time.monotonic_ns()).ljust(4096, b"\0")
def record(n, name):
    t = time.monotonic_ns()
    return RECORD.pack(n + 1, 1, 0, t - 2000, t - 1000, t - 3000, n + 1, 0, 0, 0, 128, pid, 0, name)
if kind == "fifo":
    os.mkfifo(path)
elif kind == "shadow":
    os.symlink("/etc/shadow", path)
elif kind in ("zero", "huge"):
    with open(path, "wb") as f:
        f.write(header(0 if kind == "zero" else 0xFFFFFFFF, 10).ljust(4096 + 184 * 64, b"\0"))
else:  # "good", "truncate": a ring of 64 records, appended to
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.pwrite(fd, header(64, 0).ljust(4096 + 184 * 64, b"\0"), 0)
    n = 0
    deadline = time.time() + 600
    while time.time() < deadline:
        name = b"strata_hostile_test_good_kernel" if kind == "good" else b"truncated_kernel"
        os.pwrite(fd, record(n, name), 4096 + (n % 64) * 184)
        n += 1
        os.pwrite(fd, struct.pack("<Q", n), 32)
        if kind == "truncate" and n == 200:
            os.ftruncate(fd, 100)  # the reader had it open: a shared map would fault now
        time.sleep(0.01)
print("ready", flush=True)
time.sleep(600)
'''

KINDS = ["fifo", "shadow", "zero", "huge", "truncate", "good"]


def exit_code(p, timeout):
    """The process's exit status, or None when it did not end in time (a hung agent)."""
    try:
        return p.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def main():
    if os.geteuid() != 0:
        raise SystemExit("hostile_timeline_test needs root (BPF)")
    tmp = tempfile.mkdtemp(prefix="strata-hostile-")
    rendezvous = os.path.join(tmp, "timeline")
    os.mkdir(rendezvous)
    os.chmod(rendezvous, 0o1777)
    port, mport = free_port(), free_port()
    url = "http://127.0.0.1:%d" % port
    db = os.path.join(tmp, "server.db")
    tag = "STRATA_HOSTILE_TEST"
    try:
        server = start([STRATA, "serve", "--store", "sqlite:" + db, "--listen", "127.0.0.1:%d" % port],
                       os.path.join(tmp, "serve.log"))
        env = dict(os.environ)
        env["STRATA_TIMELINE_DIR"] = rendezvous
        agent = start([STRATA, "agent", "--server", url, "--node", "hostile-n0", "--window", "0.5", "--layers", "cpu,gpu",
                       "--select", "%s=%d" % (tag, os.getpid()), "--spool", os.path.join(tmp, "spool"),
                       "--listen-metrics", "127.0.0.1:%d" % mport], os.path.join(tmp, "agent.log"), env=env)
        deadline = time.time() + 60
        while time.time() < deadline and not scrape(mport):
            time.sleep(0.2)
        check(bool(scrape(mport)), "the agent serves /metrics")
        wenv = dict(os.environ)
        wenv[tag] = str(os.getpid())
        wenv["STRATA_TIMELINE_DIR"] = rendezvous  # the writers' side of the rendezvous (abi/gpu_timeline.h)
        writers = {k: start([sys.executable, "-c", WRITER, k, rendezvous], os.path.join(tmp, k + ".log"), env=wenv)
                        for k in KINDS}
        sent_before = metric(scrape(mport), "strata_agent_batches_sent_total") or 0
        # Watch for a while: the agent must stay up and keep shipping.
        alive = True
        deadline = time.time() + 15
        while time.time() < deadline:
            alive = alive and agent.poll() is None
            time.sleep(0.25)
        page = scrape(mport)
        check(alive and agent.poll() is None, "the agent kept running (exit %s)" % agent.poll())
        sent_after = metric(page, "strata_agent_batches_sent_total") or 0
        check(sent_after >= sent_before + 5, "the agent kept shipping: %d batches sent, %d before the hostile files"
              % (sent_after, sent_before))
        for k, p in writers.items():
            check(p.poll() is None, "watched process '%s' is still running" % k)
        refused = metric(page, "strata_agent_gpu_comm_timelines_refused_total")
        check(refused is not None and refused >= 4,
              "the refused timelines are counted (fifo, shadow, zero, huge): %s" % refused)
        agent.send_signal(signal.SIGTERM)
        code = exit_code(agent, 60)
        check(code == 0, "the agent exited cleanly on SIGTERM (exit %s)" % code)
        server.send_signal(signal.SIGTERM)
        exit_code(server, 60)
        con = sqlite3.connect("file:%s?mode=ro" % db, uri=True, timeout=10)
        try:
            good = con.execute("SELECT COUNT(*) FROM metrics WHERE name = 'gpu.kernel_count' AND label = ? AND pid = ?",
                               ("strata_hostile_test_good_kernel", writers["good"].pid)).fetchone()[0]
            check(good > 0, "the good timeline was read and shipped: %d kernel-count rows" % good)
            shadow = con.execute("SELECT COUNT(*) FROM metrics WHERE pid = ? AND name LIKE 'gpu.%'",
                                 (writers["shadow"].pid,)).fetchone()[0]
            check(shadow == 0, "nothing read through the link to /etc/shadow (%d GPU rows)" % shadow)
        finally:
            con.close()
    finally:
        stop_all()
    finish(tmp, "hostile-timeline")


if __name__ == "__main__":
    main()
