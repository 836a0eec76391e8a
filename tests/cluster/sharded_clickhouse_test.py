#!/usr/bin/env python3
"""Two `strata serve` collectors sharing one sharded ClickHouse (README "ClickHouse cluster").

usage: sharded_clickhouse_test.py BUILD_DIR   (root: the agents use BPF)

Two Debian clickhouse-server processes on 127.0.0.1 and 127.0.0.2 (one HTTP port, as a cluster's
servers share one configuration) form the 2-shard cluster `strata_shards`. Collector A writes
through the first, collector B through the second, both with
`--store clickhouse://HOST:PORT/strata_sh?cluster=strata_shards`, which creates the local tables
and the Distributed tables over them on both shards. Agent n0 ships to A, agent n1 to B, for one
4-rank sim job; A is killed mid-run and restarted. Checked:
  - every acknowledged row is in the store exactly once, per node and kind, read through either server;
  - the rows are spread over the shards (stacks by content id; a node's rows on one shard);
  - the job is diagnosed by one collector (the other hands it over), and both answer its findings
    with all 4 ranks in view;
  - a batch cut short between tables (a failpoint kills the collector) is removed on the shards
    and applied exactly once when resent.
"""
import json
import os
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
from harness import (check, clickhouse_query, finish, free_port, http, make_batch, parse_agent_log,  # noqa: E402
                     scrape, start, start_clickhouse, stop_all, stop_clickhouse, wait_http, TORN_BATCH)

BUILD = os.path.abspath(sys.argv[1])
SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STRATA = os.path.join(BUILD, "bin", "strata")
SIM = os.path.join(BUILD, "bin", "strata-sim")
TOKEN = "sh4rd-" + os.urandom(6).hex()
RUN_ID = os.urandom(6).hex()
CLUSTER = "strata_shards"
DB = "strata_sh"
HOSTS = ["127.0.0.1", "127.0.0.2"]
KINDS = ["collectives", "stack_counts", "metrics", "steps", "device_activity", "communicators", "launch_samples"]



def query(i, sql):
    return clickhouse_query(HOSTS[i], HTTP_PORT, sql)


def count(i, table, where=""):
    return int(query(i, "SELECT count() FROM %s.%s %s" % (DB, table, where))[0][0])


def metric_value(page, series):
    for line in page.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return None


def main():
    global HTTP_PORT
    if os.geteuid() != 0:
        raise SystemExit("sharded_clickhouse_test needs root (BPF)")
    tmp = tempfile.mkdtemp(prefix="strata-sharded-")
    HTTP_PORT = free_port()
    tcp = [free_port(), free_port()]  # one per server: ClickHouse knows itself in the cluster by its port
    shards = "".join("<shard><replica><host>%s</host><port>%d</port></replica></shard>" % (h, p)
                     for h, p in zip(HOSTS, tcp))
    remote = "<%s>%s</%s>" % (CLUSTER, shards, CLUSTER)
    servers = [start_clickhouse(os.path.join(tmp, "ch%d" % i), HOSTS[i], HTTP_PORT, tcp[i], remote) for i in range(2)]
    token_file = os.path.join(tmp, "token")
    with open(token_file, "w") as f:
        f.write(TOKEN + "\n")
    ports = [free_port(), free_port()]
    urls = ["http://127.0.0.1:%d" % p for p in ports]

    def serve_args(i):
        return [STRATA, "serve", "--store", "clickhouse://%s:%d/%s?cluster=%s" % (HOSTS[i], HTTP_PORT, DB, CLUSTER),
                "--listen", "127.0.0.1:%d" % ports[i], "--token-file", token_file, "--diagnose-every", "1"]

    try:
        bad = start([STRATA, "serve", "--store", "clickhouse://%s:%d/%s?cluster=no_such" % (HOSTS[0], HTTP_PORT, DB),
                     "--listen", "127.0.0.1:%d" % free_port()], os.path.join(tmp, "serve-bad.log"))
        code = bad.wait(60)
        err = open(os.path.join(tmp, "serve-bad.log")).read().strip()
        check(code == 2 and "no cluster 'no_such'" in err and len(err.splitlines()) == 1,
              "a cluster the servers do not define: exit 2, one line (%d: %s)" % (code, err[:160]))

        collectors = [start(serve_args(i), os.path.join(tmp, "serve%d.log" % i)) for i in range(2)]
        for i in range(2):
            if not check(wait_http(urls[i] + "/metrics", 60), "collector %s listens" % "AB"[i]):
                raise SystemExit("collector %s: %s" % ("AB"[i], open(os.path.join(tmp, "serve%d.log" % i)).read()[-600:]))
        for i in range(2):
            tables = {r[0] for r in query(i, "SELECT name FROM system.tables WHERE database = '%s'" % DB)}
            check({"steps", "steps_local", "stacks", "stacks_local", "meta"} <= tables,
                  "shard %d has the local tables and the Distributed ones over them" % (i + 1))

        agents, metric_ports = [], []
        for i, sel in enumerate(["LOCAL_RANK=0,1", "LOCAL_RANK=2,3"]):
            log = os.path.join(tmp, "agent%d.log" % i)
            mport = free_port()
            a = start([STRATA, "agent", "--server", urls[i], "--node", "n%d" % i, "--token-file", token_file,
                       "--window", "2", "--select", sel, "--select", "STRATA_CLUSTER_TEST=" + RUN_ID,
                       "--spool", os.path.join(tmp, "spool%d" % i), "--listen-metrics", "127.0.0.1:%d" % mport], log)
            agents.append((a, log))
            metric_ports.append(mport)
        time.sleep(2)
        sim_env = dict(os.environ, STRATA_CLUSTER_TEST=RUN_ID, STRATA_SIM_STARTUP_MS="4000")
        sim = start([SIM, "run", "--ranks", "4", "--steps", "100", "--quiet"], os.path.join(tmp, "sim.log"),
                    env=sim_env)
        time.sleep(8)
        collectors[0].send_signal(signal.SIGKILL)
        collectors[0].wait()
        time.sleep(3)  # agent n0 spools meanwhile
        collectors[0] = start(serve_args(0), os.path.join(tmp, "serve0-again.log"))
        check(wait_http(urls[0] + "/metrics", 60), "collector A restarted")
        check(sim.wait(240) == 0, "sim job of 4 ranks finished")
        # The agents' spools drain at the collectors' pace (each insert waits for both shards): the
        # agents stop once every batch they sealed is acknowledged, or after 5 minutes.
        for port in metric_ports:
            for _ in range(600):
                left = metric_value(scrape(port), "strata_agent_spool_batches")
                if left == 0:
                    break
                time.sleep(0.5)
        for a, _ in agents:
            a.send_signal(signal.SIGTERM)
        for a, _ in agents:
            a.wait(90)

        # -- exactly once, through either server
        for i, (_, log) in enumerate(agents):
            acked, sealed, _, pending, _ = parse_agent_log(log)
            node = "n%d" % i
            check(pending == 0 and acked == sealed, "%s: spool drained, every sealed row acknowledged" % node)
            for kind in KINDS:
                stored = [count(s, kind, "WHERE node = '%s'" % node) for s in range(2)]
                check(stored[0] == stored[1] == acked.get(kind, 0),
                      "%s %s: %s rows through the two servers, %d acknowledged" % (node, kind, stored,
                                                                                   acked.get(kind, 0)))
        # -- spread over the shards
        stacks = [count(s, "stacks_local") for s in range(2)]
        check(min(stacks) > 0, "stacks on both shards (by content id): %s" % stacks)
        for node in ("n0", "n1"):
            holders = [s for s in range(2) if count(s, "steps_local", "WHERE node = '%s'" % node) > 0]
            check(len(holders) == 1, "node %s's steps on one shard: %s" % (node, holders))

        # -- one collector diagnoses the job, with every rank in view
        status, body = http("GET", urls[1] + "/api/v1/jobs", token=TOKEN)
        jobs = [j for j in json.loads(body)["jobs"] if j["job"].startswith("strata-sim")] if status == 200 else []
        check(len(jobs) == 1 and jobs[0]["ranks"] == 4 and jobs[0]["nodes"] == ["n0", "n1"],
              "jobs API on B: one job of 4 ranks over n0 and n1: %s" % body[:200])
        job = jobs[0]["job"] if jobs else ""
        time.sleep(4)  # a last round for the last windows
        pages = [scrape_serve(urls[i]) for i in range(2)]
        kept = [metric_value(p, 'strata_serve_diagnoses_total{outcome="kept"}') or 0 for p in pages]
        handed = [metric_value(p, "strata_serve_jobs_handed_over_total") or 0 for p in pages]
        owner = 0 if kept[0] > 0 else 1
        check(sum(1 for k in kept if k > 0) == 1 and handed[1 - owner] > 0 and kept[1 - owner] == 0,
              "one collector diagnoses the job, the other hands it over (kept %s, handed over %s)" % (kept, handed))
        for i in range(2):
            status, body = http("GET", urls[i] + "/api/v1/findings?job=" + job, token=TOKEN)
            reply = json.loads(body) if status == 200 else {}
            check(reply.get("ranks") == 4, "findings on %s: the kept diagnosis with 4 ranks: %s" % ("AB"[i], body[:160]))

        # -- a batch cut short between tables is removed on the shards and applied once
        collectors[0].terminate()
        collectors[0].wait(30)
        t = int(time.time() * 1e9)
        batch = make_batch(SOURCE, tmp, TORN_BATCH % {"t": t, "t1": t + 10**9}, "torn")
        env = dict(os.environ, STRATA_FAILPOINT_CLICKHOUSE_DIE_AFTER_INSERTS="6")
        dying = start(serve_args(0), os.path.join(tmp, "serve0-dying.log"), env=env)
        check(wait_http(urls[0] + "/metrics", 60), "collector A with a failpoint listens")
        try:
            status, _ = http("POST", urls[0] + "/api/v1/ingest", batch, token=TOKEN)
        except OSError:
            status = None
        check(status is None and dying.wait(30) == 137, "collector A died while applying the batch (failpoint)")
        # The failpoint stops after 6 table inserts: attempt, recording, process, frames, stack, counts.
        want = {"recordings": 1, "processes": 1, "stack_counts": 1, "metrics": 1, "collectives": 2, "steps": 1}
        partial = {tb: count(0, tb, "WHERE node = 'torn'") for tb in want}
        check(partial != want and count(0, "ingest_batches", "WHERE agent_id = 'torn'") == 0,
              "the interrupted batch left part of its rows: %s" % partial)
        status, reply = http("POST", urls[1] + "/api/v1/ingest", batch, token=TOKEN)
        check(status == 200 and b"applied" in reply, "resent to collector B: applied: %s" % reply[:100])
        after = [{tb: count(s, tb, "WHERE node = 'torn'") for tb in want} for s in range(2)]
        check(after[0] == after[1] == want, "every row of the batch once, through both servers: %s" % after)
        status, reply = http("POST", urls[1] + "/api/v1/ingest", batch, token=TOKEN)
        check(status == 200 and b"duplicate" in reply, "sent again: a duplicate")
    finally:
        stop_all()
        for s in servers:
            stop_clickhouse(s)
    finish(tmp, "sharded ClickHouse")


def scrape_serve(url):
    status, body = http("GET", url + "/metrics")
    return body.decode() if status == 200 else ""


if __name__ == "__main__":
    main()
