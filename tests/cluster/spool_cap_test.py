#!/usr/bin/env python3
"""The agent's on-disk spool under a size cap (label cluster; root).

`strata agent --server URL --spool-max-mb 0.0625` (64 KiB) ships every half second to a collector
that is not there yet, while a 2-rank strata-sim job runs: batches pile up in the spool until the
cap, then the oldest are dropped. Then `strata serve` comes up and the agent delivers the rest.

Checks: the spool's files never hold more than the cap (watched every 50 ms; the agent's
strata_agent_spool_bytes too); batches and rows are dropped and counted (/metrics and the agent's
closing lines); once the collector is up the spool drains; the store holds, for every kind of
record, exactly the rows the agent had acknowledged (nothing duplicated), and the rows the agent
sealed are exactly those acknowledged plus those dropped (nothing else lost).

usage: spool_cap_test.py BUILD_DIR
"""
import os
import re
import signal
import sqlite3
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
from harness import check, finish, free_port, metric, parse_agent_log, scrape, start, stop_all  # noqa: E402

BUILD = os.path.abspath(sys.argv[1])
STRATA = os.path.join(BUILD, "bin", "strata")
SIM = os.path.join(BUILD, "bin", "strata-sim")
CAP = 65536  # --spool-max-mb 0.0625
KINDS = ["collectives", "stack_counts", "metrics", "steps", "device_activity", "communicators", "launch_samples"]
NODE = "spool-n0"


def spool_bytes(path):
    """What the spool's files hold now (batches and a batch being written)."""
    total = 0
    try:
        for name in os.listdir(path):
            try:
                total += os.stat(os.path.join(path, name)).st_size
            except FileNotFoundError:
                pass  # sent or dropped meanwhile
    except FileNotFoundError:
        pass
    return total


def main():
    if os.geteuid() != 0:
        raise SystemExit("spool_cap_test needs root (BPF)")
    tmp = tempfile.mkdtemp(prefix="strata-spool-")
    spool = os.path.join(tmp, "spool")
    port, mport = free_port(), free_port()
    url = "http://127.0.0.1:%d" % port
    db = os.path.join(tmp, "server.db")
    agent_log = os.path.join(tmp, "agent.log")
    try:
        agent = start([STRATA, "agent", "--server", url, "--node", NODE, "--window", "0.5", "--select",
                       "STRATA_SPOOL_TEST=%d" % os.getpid(), "--spool", spool, "--spool-max-mb", "0.0625",
                       "--listen-metrics", "127.0.0.1:%d" % mport], agent_log)
        env = dict(os.environ)
        env["STRATA_SPOOL_TEST"] = str(os.getpid())
        sim = start([SIM, "run", "--ranks", "2", "--steps", "300", "--quiet"], os.path.join(tmp, "sim.log"), env=env)

        # -- the collector is away: the spool fills to its cap and drops the oldest
        most, most_reported, dropped, deadline = 0, 0, 0, time.time() + 120
        while time.time() < deadline and sim.poll() is None:
            most = max(most, spool_bytes(spool))
            page = scrape(mport)
            most_reported = max(most_reported, metric(page, "strata_agent_spool_bytes") or 0)
            dropped = metric(page, "strata_agent_batches_dropped_total") or 0
            if dropped >= 5:
                break
            time.sleep(0.05)
        check(dropped >= 5, "batches dropped while the collector was away: %d" % dropped)
        for _ in range(40):  # and a little longer, at the cap
            most = max(most, spool_bytes(spool))
            time.sleep(0.05)
        page = scrape(mport)
        most_reported = max(most_reported, metric(page, "strata_agent_spool_bytes") or 0)
        check(0 < most <= CAP, "the spool's files held at most %d bytes (cap %d)" % (most, CAP))
        check(0 < most_reported <= CAP, "the agent reported at most %d spool bytes (cap %d)" % (most_reported, CAP))
        rows_dropped = sum(float(v) for v in re.findall(r'^strata_agent_records_dropped_total\{kind="[^"]+"\} (\S+)$',
                                                            page, re.M))
        check(rows_dropped > 0, "/metrics counts the dropped rows: %d" % rows_dropped)
        failed = metric(page, "strata_agent_batch_send_failures_total") or 0
        check(failed > 0, "send attempts failed meanwhile: %d" % failed)

        # -- the collector comes up: the rest is delivered
        server = start([STRATA, "serve", "--store", "sqlite:" + db, "--listen", "127.0.0.1:%d" % port],
                       os.path.join(tmp, "serve.log"))
        check(sim.wait(300) == 0, "the sim job finished")
        drained = False
        deadline = time.time() + 60
        while time.time() < deadline:
            most = max(most, spool_bytes(spool))
            page = scrape(mport)
            if metric(page, "strata_agent_spool_batches") == 0 and (metric(page, "strata_agent_batches_sent_total") or 0) > 0:
                drained = True
                break
            time.sleep(0.2)
        check(drained, "the spool drained once the collector was up")
        check(most <= CAP, "the spool never held more than the cap: %d bytes" % most)
        agent.send_signal(signal.SIGTERM)
        check(agent.wait(60) == 0, "agent exited cleanly")
        server.send_signal(signal.SIGTERM)
        server.wait(60)

        acked, sealed, dropped_rows, pending, batches_dropped = parse_agent_log(agent_log)
        print("agent: sealed %s\n       acked %s\n       dropped %s\n       batches dropped %s, pending %s" %
              (sealed, acked, dropped_rows, batches_dropped, pending), flush=True)
        check(pending == 0, "nothing left in the spool (pending %s)" % pending)
        check((batches_dropped or 0) >= 5, "the agent's summary counts %s dropped batches" % batches_dropped)
        check(sum(dropped_rows.values()) > 0, "rows dropped, by kind: %s" % dropped_rows)
        con = sqlite3.connect("file:%s?mode=ro" % db, uri=True, timeout=10)
        try:
            for kind in KINDS:
                stored = con.execute("SELECT COUNT(*) FROM %s t JOIN recordings r ON r.id = t.recording_id "
                                     "WHERE r.node = ?" % kind, (NODE,)).fetchone()[0]
                a, s, d = acked.get(kind, 0), sealed.get(kind, 0), dropped_rows.get(kind, 0)
                check(stored == a, "%s: the store holds %d rows, the agent had %d acknowledged" % (kind, stored, a))
                check(s == a + d, "%s: %d sealed = %d acknowledged + %d dropped" % (kind, s, a, d))
            batches = con.execute("SELECT COUNT(*) FROM ingest_batches").fetchone()[0]
        finally:
            con.close()
        m = re.search(r"batches sent (\d+)", open(agent_log).read())
        sent = int(m.group(1)) if m else None
        check(sent is not None and batches == sent, "the server applied %d batches, the agent had %s acknowledged"
              % (batches, sent))
        check(acked.get("collectives", 0) > 0 and acked.get("stack_counts", 0) > 0,
              "collectives and stack counts were delivered after the outage")
    finally:
        stop_all()
    finish(tmp, "spool")


if __name__ == "__main__":
    main()
