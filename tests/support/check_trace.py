#!/usr/bin/env python3
"""Schema check of a Trace Event JSON file (what Perfetto and chrome://tracing open).

usage: check_trace.py TRACE.json EXPECTED_RANKS
Exits 0 when valid and it holds one process per rank, with GPU stream, communicator and step
tracks; else prints the first problem and exits 1.
"""
import json
import sys


def fail(msg):
    print("check_trace: " + msg)
    sys.exit(1)


def main():
    path, ranks = sys.argv[1], int(sys.argv[2])
    with open(path) as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        fail("top level must be an object with a traceEvents list")
    procs = {}
    threads = {}
    for i, e in enumerate(doc["traceEvents"]):
        ph = e.get("ph")
        if ph not in ("M", "X", "C", "i", "B", "E"):
            fail("event %d: unknown phase %r" % (i, ph))
        for key in ("pid", "tid"):
            if not isinstance(e.get(key), int):
                fail("event %d: %s must be an integer" % (i, key))
        if ph == "M":
            if e.get("name") == "process_name":
                procs[e["pid"]] = e["args"]["name"]
            elif e.get("name") == "thread_name":
                threads.setdefault(e["pid"], []).append(e["args"]["name"])
            continue
        ts = e.get("ts")
        if not isinstance(ts, (int, float)) or ts < 0:
            fail("event %d: ts must be a non-negative number" % i)
        if ph == "X" and (not isinstance(e.get("dur"), (int, float)) or e["dur"] < 0):
            fail("event %d: X needs a non-negative dur" % i)
        if ph == "C" and not isinstance(e.get("args"), dict):
            fail("event %d: counter needs args" % i)
        if ph != "C" and not isinstance(e.get("name"), str):
            fail("event %d: name must be a string" % i)
    rank_procs = [p for p, n in procs.items() if n.startswith("rank ")]
    if len(rank_procs) != ranks:
        fail("expected %d rank processes, found %d: %s" % (ranks, len(rank_procs), sorted(procs.values())))
    for p in rank_procs:
        names = threads.get(p, [])
        for kind in ("GPU ", "comm ", "steps"):
            if not any(kind in n for n in names):
                fail("rank process %s has no %r track (tracks: %s)" % (procs[p], kind, names))
    print("check_trace: ok: %d events, %d rank processes" % (len(doc["traceEvents"]), len(rank_procs)))


if __name__ == "__main__":
    main()
