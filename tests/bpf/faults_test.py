#!/usr/bin/env python3
"""Faults around `strata record` (label bpf; root): each case must end bounded and leave no trace.

- exec: the target replaces itself (sh -> exec'ed program): followed, recording ends with it;
- fork storm: 1,500 short children: record finishes, in bounded time, and counts them;
- dlclose: the NCCL stand-in loaded and unloaded 40 times while the comm layer probes it;
- kill -9: the recorder killed mid-run leaves no BPF program, link or uprobe of its pid, and a
  new recording works at once;
- full disk: the store on a 1 MiB tmpfs: record stops with a clear error, exit code non-zero, and
  what it committed before stays a readable strata store;
- capabilities: while recording, strata keeps only CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE,
  CAP_DAC_READ_SEARCH, CAP_SYSLOG (agent/privileges.h), and still probes a library loaded later.
Usage: faults_test.py BUILD_DIR
"""
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time

B = os.path.abspath(sys.argv[1])
STRATA = os.path.join(B, "bin", "strata")
NCCL = os.environ.get("STRATA_NCCL", os.path.join(B, "testbed", "lib", "libnccl.so.2"))
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def record(tmp, name, cmd, extra=(), timeout=120, env=None):
    db = os.path.join(tmp, name + ".db")
    t0 = time.monotonic()
    p = subprocess.run([STRATA, "record", "-o", db, *extra, "--", *cmd], capture_output=True, text=True,
                       timeout=timeout, env=env)
    return p, db, time.monotonic() - t0


def rows(db, sql):
    con = sqlite3.connect("file:" + db + "?mode=ro", uri=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def bpf_ids(pid):
    """The BPF programs and links this process holds (prog_id / link_id of its fds' fdinfo)."""
    ids = set()
    fd_dir = f"/proc/{pid}/fdinfo"
    for fd in os.listdir(fd_dir):
        try:
            with open(os.path.join(fd_dir, fd)) as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key in ("prog_id", "link_id"):
                        ids.add((key[:-3], int(value)))
        except OSError:
            continue
    return ids


def still_loaded(ids):
    """Those of `ids` the kernel still has, and the uprobe events of the tracefs (libbpf's legacy
    attach names them libbpf_PID_...; perf-based uprobes leave none)."""
    left = [f"{kind} {i}" for kind, i in ids
            if subprocess.run(["bpftool", kind, "show", "id", str(i)], capture_output=True).returncode == 0]
    return left


def uprobe_events(pid):
    for path in ("/sys/kernel/tracing/uprobe_events", "/sys/kernel/debug/tracing/uprobe_events"):
        try:
            with open(path) as f:
                return [l for l in f if f"_{pid}_" in l]
        except OSError:
            continue
    return []


def main():
    tmp = tempfile.mkdtemp(prefix="strata-faults-")
    try:
        # exec
        p, db, _ = record(tmp, "exec", ["sh", "-c", "exec sh -c 'i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done'"],
                          ["--layers", "cpu"])
        check(p.returncode == 0 and rows(db, "select count(*) from processes")[0][0] >= 1,
              f"exec: recorded (exit {p.returncode}) {p.stderr.strip()[-200:] if p.returncode else ''}")

        # fork storm
        storm = "for i in $(seq 1500); do /bin/true & done; wait"
        p, db, took = record(tmp, "storm", ["sh", "-c", storm], ["--layers", "cpu,offcpu,os"], timeout=180)
        n = rows(db, "select count(*) from processes")[0][0] if p.returncode == 0 else 0
        check(p.returncode == 0 and took < 120, f"fork storm: finished in {took:.1f} s, exit {p.returncode}, {n} processes")

        # dlclose while probed
        if os.path.exists(NCCL):
            # Loaded after start-up, so its uprobes attach with the reduced capabilities.
            py = ("import ctypes, _ctypes, time\ntime.sleep(0.5)\n"
                  f"for i in range(40):\n  h = ctypes.CDLL('{NCCL}')\n  v = ctypes.c_int()\n"
                  "  h.ncclGetVersion(ctypes.byref(v))\n  _ctypes.dlclose(h._handle)\n")
            p, db, took = record(tmp, "dlclose", [sys.executable, "-c", py], ["--layers", "cpu,comm"])
            stat = lambda key: (rows(db, f"select value from agent_stats where key='{key}'") or [(-1,)])[0][0]
            hits = stat("gpu_comm.probe_entries") if p.returncode == 0 else -1
            errors = stat("gpu_comm.attach_errors") if p.returncode == 0 else -1
            # How many calls are caught depends on how soon the probes attach after each dlopen; that
            # every attach succeeded (with the reduced capabilities) does not.
            check(p.returncode == 0 and errors == 0, f"dlclose: 40 load/unload cycles under the comm layer, exit "
                                                     f"{p.returncode} in {took:.1f} s, {hits:.0f} probe hits, "
                                                     f"{errors:.0f} attach errors")

        # kill -9, then no leftovers, then record again
        db = os.path.join(tmp, "killed.db")
        load = f"ctypes.CDLL('{NCCL}'); " if os.path.exists(NCCL) else ""  # uprobes too, when built
        proc = subprocess.Popen([STRATA, "record", "-o", db, "--", sys.executable, "-c",
                                 f"import ctypes, time; {load}time.sleep(30)"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        time.sleep(3)
        during = bpf_ids(proc.pid)
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
            children = [int(c) for c in f.read().split()]
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for c in children:  # the target outlives strata: end it, by its own pid
            os.kill(c, signal.SIGKILL)
        time.sleep(0.5)
        left = still_loaded(during) + uprobe_events(proc.pid)
        check(len(during) > 0 and not left,
              f"kill -9: {len(during)} BPF programs/links while running, left after: {left or 'none'}")
        p, db2, _ = record(tmp, "after_kill", ["sh", "-c", "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done"],
                           ["--layers", "cpu"])
        check(p.returncode == 0, f"kill -9: a new recording works (exit {p.returncode})")

        # full disk
        mnt = os.path.join(tmp, "small")
        os.mkdir(mnt)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mnt]).returncode == 0:
            try:
                db = os.path.join(mnt, "full.db")
                busy = "import os\nfor d in range(60000):\n exec(f'def f{d}(): return sum(range(50))\\nf{d}()')\n"
                p = subprocess.run([STRATA, "record", "-F", "999", "--window", "0.2", "-o", db, "--",
                                    sys.executable, "-c", busy], capture_output=True, text=True, timeout=180)
                err = p.stderr.strip().splitlines()
                check(p.returncode != 0 and any("full" in l.lower() or "space" in l.lower() for l in err),
                      f"full disk: exit {p.returncode}, says: {err[-1] if err else ''}")
                ok = rows(db, "pragma quick_check")[0][0] == "ok" if os.path.exists(db) else False
                check(ok, "full disk: what was committed is an intact SQLite file")
                r = subprocess.run([STRATA, "report", db], capture_output=True, text=True)
                check(r.returncode == 0, f"full disk: strata report reads it (exit {r.returncode})")
            finally:
                subprocess.run(["umount", mnt])

        # capabilities kept while recording
        db = os.path.join(tmp, "caps.db")
        proc = subprocess.Popen([STRATA, "record", "-o", db, "--", "sleep", "3"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        time.sleep(1.5)
        with open(f"/proc/{proc.pid}/status") as f:
            eff = int([l for l in f if l.startswith("CapEff:")][0].split()[1], 16)
        proc.wait()
        want = (1 << 2) | (1 << 19) | (1 << 34) | (1 << 38) | (1 << 39)
        check(eff == want, f"capabilities while recording: {eff:#x} (want {want:#x}: dac_read_search, sys_ptrace, "
                           "syslog, perfmon, bpf)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
