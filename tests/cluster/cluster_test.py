#!/usr/bin/env python3
"""Cluster pipeline end to end (root): `strata serve` on loopback, two agents as two nodes
(--node n0/n1, ranks split by --select LOCAL_RANK), a 4-rank strata-sim job.

Checks: the collector diagnoses the job as windows arrive and keeps it (findings API, diagnoses
table, `strata diagnose --server`); the store holds exactly what each agent says the server acknowledged (rows per kind per
node) and each agent's sealed rows were all acknowledged; the server is killed (SIGKILL) mid-run
and restarted, and still nothing is lost or duplicated; a killed agent's node turns silent and its
job degraded; a missing or wrong token gets 401; garbage, truncated, oversized, future-version
batches get a 4xx and leave the store untouched. Each rank's collectives, drilled down from the
agents' flight recorders through the server, are the sim's; a process in a kubepods cgroup carries
its pod and container ids; (ClickHouse) a batch cut short between tables lands exactly once, and
the unit tests that need a server (Store.*OnClickHouse, DiagnoseRounds.*OnClickHouse) pass against it.

usage: cluster_test.py BUILD_DIR [sqlite|clickhouse]
"""
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
from harness import (check, clickhouse_query, finish, free_port, http, make_batch, parse_agent_log, start,  # noqa: E402
                     start_clickhouse, stop_all, stop_clickhouse, wait_http, TORN_BATCH)

BUILD = os.path.abspath(sys.argv[1])
BACKEND = sys.argv[2] if len(sys.argv) > 2 else "sqlite"
SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STRATA = os.path.join(BUILD, "bin", "strata")
SIM = os.path.join(BUILD, "bin", "strata-sim")
TOKEN = "t0ps3cret-" + os.urandom(6).hex()
# In the sim's environment, which its ranks inherit: the agents watch this run's ranks only, not
# those of another test's sim on the same machine.
RUN_ID = os.urandom(6).hex()
# Append-only kinds: the store must hold exactly the acknowledged rows.
KINDS = ["collectives", "stack_counts", "metrics", "steps", "device_activity", "communicators", "launch_samples"]


class SqliteBackend:
    def __init__(self, tmp):
        self.path = os.path.join(tmp, "server.db")
        self.spec = "sqlite:" + self.path

    def stop(self):
        pass

    def query(self, sql):
        db = sqlite3.connect("file:%s?mode=ro" % self.path, uri=True, timeout=10)
        try:
            return db.execute(sql).fetchall()
        finally:
            db.close()

    def per_node(self, table):
        return {n: c for n, c in self.query(
            "SELECT r.node, COUNT(*) FROM %s t JOIN recordings r ON r.id = t.recording_id GROUP BY r.node" % table)}

    def total_rows(self):
        tables = ["recordings", "processes", "frames", "stacks", "windows", "ingest_batches", "agent_ids"] + KINDS
        return {t: self.query("SELECT COUNT(*) FROM " + t)[0][0] for t in tables}


class ClickHouseBackend:
    """A real Debian clickhouse-server on loopback, with a throwaway config and data dir."""

    def __init__(self, tmp):
        self.dir = os.path.join(tmp, "clickhouse")
        self.http_port = free_port()
        self.proc = start_clickhouse(self.dir, "127.0.0.1", self.http_port, free_port())
        self.spec = "clickhouse://127.0.0.1:%d/strata_test" % self.http_port

    def stop(self):
        stop_clickhouse(self.proc)

    def query(self, sql):
        return clickhouse_query("127.0.0.1", self.http_port, sql)

    def per_node(self, table):
        return {n: int(c) for n, c in self.query(
            "SELECT node, count() FROM strata_test.%s GROUP BY node" % table)}

    def total_rows(self):
        tables = ["recordings", "processes", "frames", "stacks", "ingest_batches", "agent_ids"] + KINDS
        return {t: int(self.query("SELECT count() FROM strata_test." + t)[0][0]) for t in tables}


def place_in_pod_cgroup(pid):
    """Moves pid into a cgroup named as kubelet names a pod's container: on cgroup v2 the systemd
    driver's slices with a containerd scope, on v1 the cgroupfs driver's kubepods/QOS/podUID/ID.
    Returns (pod UID, container id as the agent should name it, the dirs made, deepest first)."""
    uid = str(uuid.uuid4())
    cid = os.urandom(32).hex()
    v2 = [m for m in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup") if os.path.exists(m + "/cgroup.controllers")]
    if v2:
        parts = ["kubepods.slice", "kubepods-besteffort.slice",
                 "kubepods-besteffort-pod%s.slice" % uid.replace("-", "_"), "cri-containerd-%s.scope" % cid]
        base, want = v2[0], "containerd://" + cid
    else:
        parts = ["kubepods", "besteffort", "pod" + uid, cid]
        base, want = "/sys/fs/cgroup/pids", cid
    dirs = [os.path.join(base, *parts[:i + 1]) for i in range(len(parts))]
    for d in dirs:
        os.makedirs(d, exist_ok=True)
    with open(os.path.join(dirs[-1], "cgroup.procs"), "w") as f:
        f.write(str(pid))
    return uid, want, list(reversed(dirs))


def drilldown(url, token_file, node, *extra):
    r = subprocess.run([STRATA, "drilldown", "--server", url, "--token-file", token_file, "--node", node] + list(extra),
                       capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


def check_drilldown(url, token_file, agents, truth_path):
    """The agents' flight recorders, asked through the server: each rank's collectives as the sim
    made them (the sim's truth: its pid, how many collectives, DDP's 3 all-reduces of 256 KiB per
    step), with contiguous sequence numbers; a window returns exactly the records inside it."""
    truth = json.load(open(truth_path))
    for rank in range(4):
        node = "n0" if rank < 2 else "n1"
        rc, out, err = drilldown(url, token_file, node, "--rank", str(rank), "--last", "10m", "--kinds",
                                 "collectives", "--json")
        if not check(rc == 0, "drilldown %s rank %d: answered (%s)" % (node, rank, err.strip()[:200])):
            continue
        d = json.loads(out)
        procs = d["processes"]
        pid = truth["pids"][str(rank)]
        check(len(procs) == 1 and procs[0]["pid"] == pid and procs[0]["rank"] == rank,
              "drilldown rank %d: one process, the sim's pid %d: %s" % (rank, pid, [(p["pid"], p["rank"]) for p in procs]))
        if not procs:
            continue
        colls = procs[0]["collectives"]
        want = [r for r in truth["per_rank"] if r["rank"] == rank][0]["collectives"]
        seqs = [c["seq"] for c in colls]
        check(len(colls) == want and procs[0]["collectives_in_window"] == want,
              "drilldown rank %d: %d collectives, the sim made %d" % (rank, len(colls), want))
        check(seqs == list(range(1, len(seqs) + 1)), "drilldown rank %d: seq 1..%d contiguous" % (rank, len(seqs)))
        check(all(c["library"] == "nccl" and c["op"] == "allreduce" and c["bytes"] == 64 * 1024 * 4 for c in colls),
              "drilldown rank %d: every one an NCCL all-reduce of 256 KiB (DDP buckets)" % rank)
        check(len({c["comm_id"] for c in colls}) == 1 and all(c["enter_ns"] <= c["exit_ns"] for c in colls),
              "drilldown rank %d: one communicator, enter <= exit" % rank)
        if len(colls) > 20:
            # A window in the middle: exactly the records that started inside it.
            a, b = colls[len(colls) // 3], colls[2 * len(colls) // 3]
            rc, out, _ = drilldown(url, token_file, node, "--rank", str(rank), "--from-ns", str(a["enter_ns"]),
                                   "--to-ns", str(b["enter_ns"]), "--json")
            sub = json.loads(out)["processes"][0]["collectives"] if rc == 0 else []
            check([c["seq"] for c in sub] == list(range(a["seq"], b["seq"] + 1)),
                  "drilldown rank %d window: seq %d..%d exactly (%d records)" % (rank, a["seq"], b["seq"], len(sub)))
    rc, out, _ = drilldown(url, token_file, "n0", "--last", "10m", "--limit", "5", "--kinds", "collectives")
    check(rc == 0 and out.count("allreduce") == 10 and "rank 0" in out and "rank 1" in out,
          "strata drilldown (text): node n0's two ranks, newest 5 each")
    rc, _, err = drilldown(url, token_file, "no-such-node")
    check(rc == 1 and "no agent" in err, "drilldown of an unknown node: refused (%s)" % err.strip()[:100])
    check(http("GET", url + "/api/v1/nodes/n0/drilldown")[0] == 401, "drilldown without a token: 401")
    # The agent's own listener wants the token too.
    nodes = json.loads(http("GET", url + "/api/v1/nodes", token=TOKEN)[1])["nodes"]
    agent_url = [n for n in nodes if n["node"] == "n0"][-1]["health"]["drilldown_url"]
    check(http("GET", agent_url + "/drilldown")[0] == 401, "agent /drilldown without a token: 401")
    check(http("GET", agent_url + "/drilldown?last=1h&kinds=collectives", token=TOKEN)[0] == 200,
          "agent /drilldown with the token: 200")
    check(http("GET", agent_url + "/drilldown?last=soon", token=TOKEN)[0] == 400, "agent /drilldown bad window: 400")




def check_interrupted_apply(tmp, backend, serve_args, url):
    """The server dies (a failpoint: _exit after its 6th table insert, as a kill would) while
    applying a batch: the store holds part of it. Resent to a restarted server, the batch lands
    exactly once: the partial rows are removed first (ALTER TABLE DELETE, waited for), then all
    rows written; sent again, it is a duplicate."""
    t = int(time.time() * 1e9)
    body = make_batch(SOURCE, tmp, TORN_BATCH % {"t": t, "t1": t + 10**9}, "torn")
    env = dict(os.environ, STRATA_FAILPOINT_CLICKHOUSE_DIE_AFTER_INSERTS="6")
    dying = start(serve_args, os.path.join(tmp, "serve-dying.log"), env=env)
    check(wait_http(url + "/metrics"), "server with a failpoint listens")
    try:
        status, _ = http("POST", url + "/api/v1/ingest", body, token=TOKEN)
    except OSError:
        status = None
    check(status is None and dying.wait(30) == 137, "the server died while applying the batch (failpoint)")

    def rows(table, where="node = 'torn'"):
        return int(backend.query("SELECT count() FROM strata_test.%s WHERE %s" % (table, where))[0][0])

    tables = {"recordings": 1, "processes": 1, "stack_counts": 1, "metrics": 1, "collectives": 2, "steps": 1}
    partial = {tb: rows(tb) for tb in tables}
    check(partial["stack_counts"] == 1 and partial["collectives"] == 0 and
          rows("ingest_batches", "agent_id = 'torn'") == 0,
          "the interrupted batch left part of its rows, and is not marked applied: %s" % partial)
    server = start(serve_args, os.path.join(tmp, "serve-after.log"))
    check(wait_http(url + "/metrics"), "server restarted after the failpoint")
    status, reply = http("POST", url + "/api/v1/ingest", body, token=TOKEN)
    check(status == 200 and b"applied" in reply, "the resent batch is applied: %s" % reply[:100])
    after = {tb: rows(tb) for tb in tables}
    check(after == tables, "every row of the batch once, none twice: %s (want %s)" % (after, tables))
    check(rows("agent_ids", "agent_id = 'torn'") == 2, "its id mappings once (recording, stack)")
    status, reply = http("POST", url + "/api/v1/ingest", body, token=TOKEN)
    check(status == 200 and b"duplicate" in reply, "sent again: a duplicate, nothing written")
    check({tb: rows(tb) for tb in tables} == tables, "and the rows stay as they were")
    server.terminate()
    server.wait(30)


def main():
    if os.geteuid() != 0:
        raise SystemExit("cluster_test needs root (BPF)")
    tmp = tempfile.mkdtemp(prefix="strata-cluster-")
    backend = ClickHouseBackend(tmp) if BACKEND == "clickhouse" else SqliteBackend(tmp)
    token_file = os.path.join(tmp, "token")
    with open(token_file, "w") as f:
        f.write(TOKEN + "\n")
    port = free_port()
    url = "http://127.0.0.1:%d" % port
    serve_args = [STRATA, "serve", "--store", backend.spec, "--listen", "127.0.0.1:%d" % port,
                  "--token-file", token_file, "--silent-after", "3"]
    try:
        if BACKEND == "clickhouse":
            # The unit tests that need a ClickHouse server (they skip without one): run here,
            # against this one, and they must pass, not skip.
            env = dict(os.environ, STRATA_TEST_CLICKHOUSE="clickhouse://127.0.0.1:%d" % backend.http_port)
            for binary, tests, least, what in [
                    ("store_test", "Store.*OnClickHouse", 3, "time range, node identity, 100k stacks, fidelity..."),
                    ("diagnose_rounds_test", "DiagnoseRounds.*OnClickHouse", 2,
                     "incremental rounds: new rows read once, a later fault found, a late batch not lost")]:
                unit = subprocess.run([os.path.join(BUILD, "tests", binary), "--gtest_filter=" + tests],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
                ran = re.search(r"\[  PASSED  \] (\d+) tests", unit.stdout)
                check(unit.returncode == 0 and ran and int(ran.group(1)) >= least and "SKIPPED" not in unit.stdout,
                      "%s %s (%s) pass against the server: %s" % (binary, tests, what, unit.stdout[-300:]))
        server = start(serve_args, os.path.join(tmp, "serve1.log"))
        check(wait_http(url + "/metrics"), "server listens on loopback")

        # -- 1. auth
        check(http("GET", url + "/api/v1/jobs")[0] == 401, "no token -> 401")
        check(http("GET", url + "/api/v1/jobs", token="wrong")[0] == 401, "wrong token -> 401")
        check(http("POST", url + "/api/v1/ingest", b"x", token="wrong")[0] == 401, "ingest with wrong token -> 401")
        check(http("GET", url + "/api/v1/jobs", token=TOKEN)[0] == 200, "right token -> 200")

        # -- 2. two agents, two nodes, four ranks; the server dies and comes back mid-run
        agents = []
        for i, sel in enumerate(["LOCAL_RANK=0,1", "LOCAL_RANK=2,3"]):
            log = os.path.join(tmp, "agent%d.log" % i)
            a = start([STRATA, "agent", "--server", url, "--node", "n%d" % i, "--token-file", token_file,
                       "--window", "1", "--select", sel, "--select", "STRATA_CLUSTER_TEST=" + RUN_ID, "--spool", os.path.join(tmp, "spool%d" % i),
                       "--listen-metrics", "127.0.0.1:%d" % free_port()], log)
            agents.append((a, log))
        time.sleep(2)
        truth_path = os.path.join(tmp, "truth.json")
        # The ranks' start-up before their first NCCL call is longer than the agents' /proc scan
        # (2 s), as PyTorch's is: the agents see every collective from the first.
        sim_env = dict(os.environ, STRATA_CLUSTER_TEST=RUN_ID, STRATA_SIM_STARTUP_MS="4000")
        sim = start([SIM, "run", "--ranks", "4", "--steps", "150", "--quiet", "--truth", truth_path],
                    os.path.join(tmp, "sim.log"), env=sim_env)
        time.sleep(8)
        server.send_signal(signal.SIGKILL)
        server.wait()
        time.sleep(3)  # agents spool meanwhile
        server = start(serve_args, os.path.join(tmp, "serve2.log"))
        check(wait_http(url + "/metrics"), "server restarted")
        check(sim.wait(180) == 0, "sim job of 4 ranks finished")
        time.sleep(3)
        status, body = http("GET", url + "/api/v1/jobs", token=TOKEN)
        jobs = json.loads(body)["jobs"]
        job = [j for j in jobs if j["job"].startswith("strata-sim")]
        check(len(job) == 1 and job[0]["ranks"] == 4 and job[0]["nodes"] == ["n0", "n1"]
              and job[0]["status"] == "healthy", "jobs API: 4 ranks over n0 and n1, healthy: %s" % body[:300])
        check_drilldown(url, token_file, agents, truth_path)
        # The collector diagnoses the job as its windows arrive and keeps the result in the store.
        sim_job = job[0]["job"] if job else ""
        status, body = http("GET", url + "/api/v1/findings?job=" + sim_job, token=TOKEN)
        kept = json.loads(body) if status == 200 else {}
        check("kept" in kept and "history" in kept and kept.get("ranks") == 4,
              "findings API: a kept diagnosis of the 4-rank job: %s" % body[:300])
        kept_rows = backend.query("SELECT count() FROM strata_test.diagnoses" if BACKEND == "clickhouse"
                                  else "SELECT COUNT(*) FROM diagnoses")
        check(int(kept_rows[0][0]) >= 1, "store: diagnoses table holds the job's latest round")
        dx = subprocess.run([STRATA, "diagnose", "--server", url, "--token-file", token_file, "--job", sim_job],
                            capture_output=True, text=True)
        check(dx.returncode == 0 and "diagnosed by strata serve" in dx.stdout,
              "strata diagnose --server: the kept diagnosis (%s)" % (dx.stdout + dx.stderr)[-200:])
        for a, _ in agents:
            a.send_signal(signal.SIGTERM)
        for a, _ in agents:
            a.wait(60)
        for i, (_, log) in enumerate(agents):
            acked, sealed, _, pending, _ = parse_agent_log(log)
            node = "n%d" % i
            check(pending == 0, "%s: spool drained (pending %s)" % (node, pending))
            check(acked == sealed, "%s: every sealed row acknowledged" % node)
            check(acked.get("collectives", 0) > 0 and acked.get("stack_counts", 0) > 0,
                  "%s: collectives and stack counts shipped" % node)
            for kind in KINDS:
                # Exactly once in both stores: ClickHouse has no transaction across tables, so a
                # batch cut short by the kill is removed and applied again (test 5 forces that case).
                stored = backend.per_node(kind).get(node, 0)
                check(stored == acked.get(kind, 0),
                      "%s %s: store holds %d rows, agent had %d acknowledged" % (node, kind, stored,
                                                                                  acked.get(kind, 0)))
        ranks = backend.query("SELECT DISTINCT rank FROM %sprocesses WHERE rank >= 0" %
                              ("strata_test." if BACKEND == "clickhouse" else ""))
        check(sorted(int(r[0]) for r in ranks) == [0, 1, 2, 3], "processes: ranks 0-3 stored")
        status, body = http("GET", url + "/api/v1/profile?rank=2", token=TOKEN)
        check(status == 200 and len(body.splitlines()) > 0, "profile API: folded stacks for rank 2")
        report = subprocess.run([STRATA, "report", "--server", url, "--token-file", token_file, "--format", "folded"],
                                capture_output=True, text=True)
        check(report.returncode == 0 and len(report.stdout.splitlines()) > 0, "strata report --server: folded")

        # -- 3. a killed agent: its node turns silent, its job is not healthy
        # It runs as in a Kubernetes pod: a kubepods cgroup, the downward API's POD_NAME / POD_NAMESPACE.
        env = dict(os.environ, STRATA_JOB="silent-test", RANK="0", WORLD_SIZE="1", POD_NAME="trainer-0",
                   POD_NAMESPACE="ml", KUBERNETES_SERVICE_HOST="10.96.0.1")
        sleeper = start(["sleep", "120"], os.path.join(tmp, "sleeper.log"), env=env)
        pod_uid, container_id, cgroup_dirs = place_in_pod_cgroup(sleeper.pid)
        a2 = start([STRATA, "agent", "--server", url, "--node", "n2", "--token-file", token_file, "--window", "1",
                    "--select", "STRATA_JOB=silent-test", "--spool", os.path.join(tmp, "spool2"),
                    "--listen-metrics", "off"], os.path.join(tmp, "agent2.log"))
        seen = False
        for _ in range(100):
            jobs = json.loads(http("GET", url + "/api/v1/jobs", token=TOKEN)[1])["jobs"]
            if any(j["job"] == "silent-test" for j in jobs):
                seen = True
                break
            time.sleep(0.2)
        check(seen, "node n2's job appears")
        rc, _, err = drilldown(url, token_file, "n2")
        check(rc == 1 and "no drill-down address" in err,
              "drilldown of a node whose agent serves no HTTP (--listen-metrics off): refused (%s)" % err.strip()[:120])
        ps = json.loads(http("GET", url + "/api/v1/processes?job=silent-test", token=TOKEN)[1])["processes"]
        check(len(ps) == 1 and ps[0]["pod_uid"] == pod_uid and ps[0]["container_id"] == container_id
              and ps[0]["pod_name"] == "trainer-0" and ps[0]["pod_namespace"] == "ml",
              "a process in a kubepods cgroup: pod %s, container %s, trainer-0 in ml on its record: %s" %
              (pod_uid, container_id, ps))
        a2.send_signal(signal.SIGKILL)
        a2.wait()
        time.sleep(5)
        nodes = json.loads(http("GET", url + "/api/v1/nodes", token=TOKEN)[1])["nodes"]
        n2 = [n for n in nodes if n["node"] == "n2"]
        check(n2 and n2[0]["status"] == "silent", "killed agent: node n2 silent")
        jobs = json.loads(http("GET", url + "/api/v1/jobs", token=TOKEN)[1])["jobs"]
        sj = [j for j in jobs if j["job"] == "silent-test"]
        check(sj and sj[0]["status"] != "healthy" and sj[0]["silent_nodes"] == ["n2"],
              "killed agent: job silent-test not healthy")
        sleeper.kill()
        sleeper.wait()
        for d in cgroup_dirs:
            try:
                os.rmdir(d)
            except OSError:
                pass

        # -- 4. bad batches: 4xx with a reason, store untouched
        before = backend.total_rows()
        good = "schema_version: 1 agent_id: \"evil\" node: \"evil\" batch_id: 1 " \
               "records { recording { local_id: 1 node: \"evil\" } }"
        valid = make_batch(SOURCE, tmp, good, "good")
        cases = {
            "garbage": os.urandom(4096),
            "empty": b"",
            "truncated": valid[: len(valid) // 2],
            "not protobuf": subprocess.run(["zstd", "-q", "-c"], input=b"\xff" * 64, capture_output=True).stdout,
            "future version": make_batch(SOURCE, tmp, good.replace("schema_version: 1", "schema_version: 99"), "future"),
            "no agent id": make_batch(SOURCE, tmp, good.replace("agent_id: \"evil\"", ""), "noagent"),
            "bad frame kind": make_batch(SOURCE, tmp, good.replace("records { recording { local_id: 1 node: \"evil\" } }",
                                                           "records { stack { local_id: 1 frames { kind: 9 } } }"),
                                         "badkind"),
            "oversized": os.urandom(33 << 20),
            # A zstd bomb: 300 MB of zeros in a small frame.
            "bomb": subprocess.run(["zstd", "-q", "-c", "-1"], input=b"\0" * (300 << 20), capture_output=True).stdout,
        }
        for name, body in cases.items():
            status, reply = http("POST", url + "/api/v1/ingest", body, token=TOKEN, timeout=60)
            reason = reply.decode(errors="replace").strip()
            check(400 <= status < 500 and "error" in reason, "%s batch -> %d %s" % (name, status, reason[:100]))
        check(backend.total_rows() == before, "bad batches left the store untouched")
        status, _ = http("POST", url + "/api/v1/ingest", valid, token=TOKEN)
        check(status == 200, "a valid hand-made batch is applied")
        status, reply = http("POST", url + "/api/v1/ingest", valid, token=TOKEN)
        check(status == 200 and b"duplicate" in reply, "the same batch again: duplicate, not applied twice")
        status, metrics = http("GET", url + "/metrics")
        check(status == 200 and b"strata_serve_batches_total" in metrics, "/metrics without a token (not under /api/)")

        # -- 5. ClickHouse: a batch cut short between tables is applied exactly once when resent
        if BACKEND == "clickhouse":
            server.terminate()
            server.wait(30)
            check_interrupted_apply(tmp, backend, serve_args, url)
    finally:
        stop_all()
        backend.stop()
    finish(tmp, "cluster (%s)" % BACKEND)


if __name__ == "__main__":
    main()
