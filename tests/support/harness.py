"""What the Python end-to-end tests share: checks that print ok/FAIL and are counted, the processes
they started (to stop at the end), a free loopback port, an agent's /metrics and its closing lines."""
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "testbed", "workloads"))
from ports import free_port  # noqa: E402,F401  (re-exported: tests import it from here)

procs = []     # every process start() started, for the test's cleanup
failures = []  # what check() found false


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)
    return cond




def start(args, log, env=None, stdin=None):
    p = subprocess.Popen(args, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env, stdin=stdin)
    procs.append(p)
    return p


def stop_all():
    """Kills what start() started and still runs."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def finish(tmp, what):
    """Ends a test: exit 1 when a check failed (its logs kept in tmp), else tmp removed and exit 0."""
    stop_all()
    if failures:
        print("%d check(s) failed; logs in %s" % (len(failures), tmp), flush=True)
        sys.exit(1)
    shutil.rmtree(tmp, ignore_errors=True)
    print("all %s checks passed" % what, flush=True)


def scrape(port, timeout=10):
    """The agent's /metrics page; "" when it does not answer."""
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=timeout) as r:
            return r.read().decode()
    except OSError:
        return ""


def metric(text, name):
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def prometheus_problems(text):
    """What breaks Prometheus conventions on a /metrics page: a sample whose family has no HELP or
    TYPE before it, a family described twice, a counter without `_total` or a gauge with it, a TYPE
    outside the text format's. [] when the page follows them."""
    problems, helped, typed = [], set(), {}
    for line in text.splitlines():
        if not line:
            continue
        m = re.match(r"# (HELP|TYPE) (\S+) ?(.*)$", line)
        if m:
            kind, name, rest = m.groups()
            seen = helped if kind == "HELP" else typed
            if name in seen:
                problems.append("%s twice for %s" % (kind, name))
            if kind == "HELP":
                helped.add(name)
                if not rest.strip():
                    problems.append("empty HELP for " + name)
            else:
                typed[name] = rest
                if rest not in ("counter", "gauge", "histogram", "summary", "untyped"):
                    problems.append("%s: unknown TYPE %r" % (name, rest))
                elif (rest == "counter") != name.endswith("_total"):
                    problems.append("%s is a %s (counters and only counters end in _total)" % (name, rest))
            continue
        if line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? \S+$", line)
        if not m:
            problems.append("not a sample line: " + line)
            continue
        name = m.group(1)
        family = name
        for suffix in ("_bucket", "_sum", "_count"):  # histogram and summary series
            if name.endswith(suffix) and typed.get(name[:-len(suffix)]) in ("histogram", "summary"):
                family = name[:-len(suffix)]
        if family not in helped or family not in typed:
            problems.append("no HELP/TYPE before " + name)
    return problems


def parse_agent_log(path):
    """The agent's closing lines: rows acked, sealed and dropped per kind, batches pending and dropped."""
    out = {"acked": {}, "sealed": {}, "dropped": {}}
    pending = batches_dropped = None
    for line in open(path):
        for tag, d in out.items():
            if line.startswith("strata: agent: " + tag):
                for kv in line[len("strata: agent: " + tag):].split():
                    k, v = kv.split("=")
                    d[k] = int(v)
        m = re.search(r"pending (\d+), dropped (\d+)", line)
        if m:
            pending, batches_dropped = int(m.group(1)), int(m.group(2))
    return out["acked"], out["sealed"], out["dropped"], pending, batches_dropped


def http(method, url, body=None, token=None, timeout=30):
    """(status, body) of one request; an ingest batch's content type when there is a body."""
    req = urllib.request.Request(url, data=body, method=method)
    if body is not None:
        req.add_header("Content-Type", "application/x-strata-batch+zstd")
    if token is not None:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_http(url, timeout=20):
    """True once url answers at all (any status) within timeout seconds."""
    end = time.time() + timeout
    while time.time() < end:
        try:
            http("GET", url, timeout=2)
            return True
        except OSError:
            time.sleep(0.1)
    return False


def make_batch(source, tmp, text, name):
    """A hand-made ingest batch: protobuf text format -> binary (protoc) -> zstd."""
    src = os.path.join(tmp, name + ".txt")
    with open(src, "w") as f:
        f.write(text)
    raw = subprocess.run(["protoc", "--proto_path=" + source + "/proto", "--encode=strata.ingest.Batch",
                          "ingest.proto"], stdin=open(src), capture_output=True, check=True).stdout
    return subprocess.run(["zstd", "-q", "-c"], input=raw, capture_output=True, check=True).stdout


def start_clickhouse(folder, host, http_port, tcp_port, remote_servers="", timeout=60):
    """A real Debian clickhouse-server listening on host, with a throwaway config and data folder
    (remote_servers: the inside of <remote_servers>, for a cluster). Exits the test if it does not
    answer within timeout seconds."""
    os.makedirs(folder + "/data", exist_ok=True)
    with open(folder + "/config.xml", "w") as f:
        f.write("""<?xml version="1.0"?>
<yandex>
  <logger><level>warning</level><log>{d}/server.log</log><errorlog>{d}/error.log</errorlog></logger>
  <http_port>{hp}</http_port><tcp_port>{tp}</tcp_port><listen_host>{h}</listen_host>
  <path>{d}/data/</path><tmp_path>{d}/tmp/</tmp_path><user_files_path>{d}/user_files/</user_files_path>
  <format_schema_path>{d}/format_schemas/</format_schema_path>
  <users_config>users.xml</users_config><default_profile>default</default_profile>
  <default_database>default</default_database><mark_cache_size>104857600</mark_cache_size>
  <uncompressed_cache_size>104857600</uncompressed_cache_size><max_concurrent_queries>50</max_concurrent_queries>
  <remote_servers>{rs}</remote_servers>
</yandex>
""".format(d=folder, hp=http_port, tp=tcp_port, h=host, rs=remote_servers))
    shutil.copy("/etc/clickhouse-server/users.xml", folder + "/users.xml")
    proc = subprocess.Popen(["/usr/sbin/clickhouse-server", "--config-file=" + folder + "/config.xml"],
                            stdout=open(folder + "/stdout.log", "w"), stderr=subprocess.STDOUT, cwd=folder)
    if not wait_http("http://%s:%d/ping" % (host, http_port), timeout):
        proc.kill()
        raise SystemExit("clickhouse-server did not start: see " + folder)
    return proc


def stop_clickhouse(proc):
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()


def clickhouse_query(host, http_port, sql):
    """Rows (tuples of strings) of one query; raises on an error."""
    status, body = http("POST", "http://%s:%d/" % (host, http_port), (sql + " FORMAT TabSeparated").encode())
    if status != 200:
        raise RuntimeError("clickhouse: %s: %s" % (sql, body.decode(errors="replace")))
    return [tuple(line.split("\t")) for line in body.decode().splitlines()]


# A hand-made batch (make_batch) of one process's rows of every kind, for the exactly-once tests:
# fill in %(t)d and %(t1)d (unix ns, t1 > t).
TORN_BATCH = """schema_version: 1 agent_id: "torn" node: "torn" batch_id: 1
records { recording { local_id: 1 node: "torn" command: "strata agent" started_ns: %(t)d sample_hz: 99 window_s: 1 } }
records { process { recording: 1 pid: 4242 node: "torn" comm: "python3" command: "python3 train.py" job: "torn-job"
                    rank: 0 local_rank: 0 world_size: 1 start_ns: %(t)d } }
records { stack { local_id: 1 frames { kind: 1 module: "/usr/bin/python3" offset: 4096 function: "main" } } }
records { window { recording: 1 start_ns: %(t)d end_ns: %(t1)d kind: 0
                   counts { pid: 4242 tid: 4242 thread_comm: "python3" stack: 1 value: 5 } } }
records { metrics { recording: 1 start_ns: %(t)d end_ns: %(t1)d metrics { pid: 4242 name: "os.cpu_ms" value: 7 } } }
records { collectives { recording: 1
                        rows { pid: 4242 tid: 4242 library: "nccl" op: "allreduce" seq: 1 enter_ns: %(t)d exit_ns: %(t1)d }
                        rows { pid: 4242 tid: 4242 library: "nccl" op: "allreduce" seq: 2 enter_ns: %(t1)d exit_ns: %(t1)d } } }
records { steps { recording: 1 rows { pid: 4242 step: 1 start_ns: %(t)d end_ns: %(t1)d } } }
"""
