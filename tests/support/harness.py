"""What the Python end-to-end tests share: checks that print ok/FAIL and are counted, the processes
they started (to stop at the end), a free loopback port, an agent's /metrics and its closing lines."""
import os
import re
import shutil
import socket
import subprocess
import sys
import urllib.request

procs = []     # every process start() started, for the test's cleanup
failures = []  # what check() found false


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)
    return cond


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


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
