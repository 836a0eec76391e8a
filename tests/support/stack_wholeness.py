#!/usr/bin/env python3
"""Whole-stack share of a recording's on-CPU samples (issue 15 item 3).

A sample's stack is whole when
- no native frame repeats the same address more than MAX_REPEAT times in a row (a frame-pointer
  walk through code that keeps data in rbp loops on one heap address; recursion repeats less),
- no native frame without a module ([unknown], [anon]) lies between two frames with one (a walk
  that went through garbage and came back by chance),
- its user part ends at a thread's or process's root (ROOTS): the walk reached the outermost frame.
Samples without any user frame (a thread in the kernel on behalf of nobody we can name) are
counted apart, not as whole.

Usage: stack_wholeness.py FILE.db [--pids P,...] [--show N]
Prints the share per recording and, with --show, the N most frequent broken stacks.
"""
import argparse
import sqlite3
import struct
import sys

# A recursive native function calls itself from one call site many times in a row: std::map's
# destructor (_Rb_tree::_M_erase) recurses once per tree level, and a red-black tree of n nodes is up
# to 2*log2(n+1) deep (CI saw 9+ in a DICOM dictionary's teardown under torch's imports). 64 covers
# any tree that fits in memory (2^32 nodes); a walk looping on one frame record repeats it until the
# depth limit (127 native frames) cuts it.
MAX_REPEAT = 64
# Where user stacks begin: the executable's entry, a thread's start (glibc), a clone'd child.
ROOTS = {"_start", "__libc_start_main", "__libc_start_call_main", "start_thread", "clone", "clone3", "__clone",
         "__clone3", "__GI___clone", "__GI___clone3", "__clone_internal"}
KIND_NATIVE, KIND_KERNEL, KIND_PYTHON = 0, 1, 2
UNKNOWN_MODULES = ("[unknown]", "[anon]", "")


def classify(frames):
    """frames: leaf first, each (kind, module, offset, function). Returns '' when whole, else why."""
    user = [f for f in frames if f[0] != KIND_KERNEL]
    if not user:
        return "no-user-frames"
    run, prev = 0, None
    for f in user:
        key = (f[0], f[1], f[2]) if f[0] == KIND_NATIVE else None
        run = run + 1 if key is not None and key == prev else 1
        prev = key
        if run > MAX_REPEAT:
            return "repeated-address"
    known = [f[0] != KIND_NATIVE or f[1] not in UNKNOWN_MODULES for f in user]
    if any(not k for k in known):
        first = known.index(True) if True in known else len(known)
        last = len(known) - 1 - known[::-1].index(True) if True in known else -1
        if any(not known[i] for i in range(first, last + 1)):
            return "unknown-between-known"
        if first > 0 and last < 0:
            return "only-unknown"
        if first > 0:
            return "unknown-leaf"
        return "unknown-outermost"
    native = [f for f in user if f[0] == KIND_NATIVE]
    if not native:
        return "no-native-root"
    root = native[-1][3] or ""
    if root not in ROOTS:
        return "no-root"
    return ""


def analyze(db, pids=None, rid=None):
    """{'samples', 'whole', 'share', 'why': {reason: samples}, 'broken': [(samples, reason, stack_id)]}"""
    con = sqlite3.connect("file:" + db + "?mode=ro", uri=True)
    con.text_factory = lambda b: b.decode("utf-8", "replace")  # a symbol name is bytes from a file
    try:
        if rid is None:
            rid = con.execute("SELECT MAX(id) FROM recordings").fetchone()[0]
        frames = {r[0]: (r[1], r[2], r[3], r[4]) for r in
                  con.execute("SELECT id, kind, module, offset, function FROM frames")}
        stacks = {}
        for sid, blob in con.execute("SELECT id, frames FROM stacks"):
            ids = struct.unpack("<%dq" % (len(blob) // 8), blob)
            stacks[sid] = [frames.get(i, (KIND_NATIVE, "[unknown]", 0, None)) for i in ids]
        q = "SELECT stack_id, pid, SUM(value) FROM stack_counts WHERE recording_id = ? AND kind = 0 GROUP BY stack_id, pid"
        total = whole = 0
        why, broken = {}, {}
        for sid, pid, n in con.execute(q, (rid,)):
            if pids is not None and pid not in pids:
                continue
            reason = classify(stacks.get(sid, []))
            total += n
            if not reason:
                whole += n
                continue
            why[reason] = why.get(reason, 0) + n
            broken[(sid, reason)] = broken.get((sid, reason), 0) + n
        out = {"samples": total, "whole": whole, "share": whole / total if total else 0.0, "why": why,
               "broken": sorted(((n, r, s) for (s, r), n in broken.items()), reverse=True), "stacks": stacks}
        return out
    finally:
        con.close()


def describe(stack):
    parts = []
    for kind, module, offset, function in stack:
        if kind == KIND_KERNEL:
            continue
        if kind == KIND_PYTHON:
            parts.append("py:" + (function or "?"))
        else:
            parts.append((function or "%s+0x%x" % (module.rsplit("/", 1)[-1], offset or 0)))
    return " <- ".join(parts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("db")
    ap.add_argument("--pids", default="")
    ap.add_argument("--show", type=int, default=0)
    a = ap.parse_args()
    pids = {int(p) for p in a.pids.split(",") if p} or None
    r = analyze(a.db, pids)
    print("samples %d whole %d share %.3f" % (r["samples"], r["whole"], r["share"]))
    for reason, n in sorted(r["why"].items(), key=lambda x: -x[1]):
        print("  %-24s %6d (%.3f)" % (reason, n, n / r["samples"] if r["samples"] else 0))
    for n, reason, sid in r["broken"][:a.show]:
        print("%6d %-22s %s" % (n, reason, describe(r["stacks"][sid])[:400]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
