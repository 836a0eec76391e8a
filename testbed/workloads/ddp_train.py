#!/usr/bin/python3
"""A real PyTorch DDP training job on the CPU (gloo), for Debian's python3 with python3-torch.

    /usr/bin/python3 testbed/workloads/ddp_train.py --ranks 2 --steps 30 [--model small|large] [--pin]
        [--num-workers N]
        [--fault host-hotspot:rank=1,start_step=5,ms=40[,where=loop|loss|worker] |
         workload-imbalance:rank=1,factor=2 | cpu-contention:rank=1,hogs=2 |
         cpu-throttling:rank=1,quota_pct=30 | network-slow:rank=1,rate_mbit=40 |
         network-slow:rank=all,rate_mbit=40 | irq-softirq:rank=1,rate=20000,filters=2000] [--truth FILE.json]

Spawns its ranks with torch.multiprocessing (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
and STRATA_JOB in each rank's environment from its start, as torchrun sets them, so an agent reads
them in /proc/PID/environ), trains a small MLP, prints per-rank step times and writes the same
ground-truth JSON as strata-sim (with each rank's baseline before the fault). Kept small for a
2-core machine.

Variants, so that a diagnosis is tried on shapes it was not tuned for (bench/diagnose_accuracy.sh):
  --model small|large  an MLP of ~85k parameters (64-256-256-10) or of ~0.6M (128-512-512-512-10);
  --pin                each rank pinned to CPU rank % CPUs (as `torchrun` + numactl/taskset setups
                       do); its DataLoader workers inherit the rank's CPU;
  --num-workers N      batches come from a torch DataLoader with N worker processes per rank
                       (forked by the rank, as PyTorch does), so load_batch runs in the workers;
  host-hotspot where=  loop: slow_augment() on the batch in the training loop (torch ops on the
                       batch); loss: label_penalty() inside the loss, pure-Python arithmetic (the
                       interpreter's own loop, no torch op); worker: augment_sample() in the
                       culprit rank's DataLoader workers (needs --num-workers > 0), whose CPU
                       time the rank waits for. cpu-throttling needs root (a cgroup CPU quota the culprit joins at start_step).
network-slow needs root too: every rank runs in a network namespace of its own behind a veth pair
whose other ends are ports of one bridge (in a namespace of its own, the fabric's switch), every
rank's gloo traffic goes over the veth addresses (GLOO_SOCKET_IFNAME), and at start_step a tc tbf
limits both directions of the culprit's link (rank=R) or of every rank's link (rank=all: a slow
fabric, whose truth is job-wide, scope job and rank -1, as strata-sim's rank=all). The namespaces and veths
go when the job ends, however it ends (SlowLink). irq-softirq needs root as well: network receive work
steered by RPS to the culprit's CPU (IrqSteer, as strata-sim's); unpinned, the culprit alone runs on
that CPU and its peers on the others.
"""
import argparse
import json
import os
import ctypes
import signal
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ports import free_port  # beside this file

LAYERS = {"host-hotspot": ("cpu", "host-hotspot", "slow_augment"),  # where=loop; see HOTSPOT_CULPRIT
          # The culprit of an imbalance is the input (every function of the step does more), as the
          # diagnosis names it: "larger batches (more work in F)".
          "workload-imbalance": ("cpu", "workload-imbalance", "larger batches"),
          "cpu-contention": ("os", "cpu-contention", "strata-hog"),
          "cpu-throttling": ("os", "cpu-throttling", "cgroup cpu quota"),
          "network-slow": ("comm", "network-slow", "link of rank %(rank)d"),
          # The source the agent names (agent/os/proc_readers.cpp), as strata-sim's irq-softirq.
          "irq-softirq": ("os", "irq-softirq", "NET_RX softirq")}
# Faults that take rank=all (every rank alike: a job-wide truth, rank -1), with the culprit they
# name then: what the ranks share, as strata-sim names it (testbed/sim/faults.cpp).
JOB_WIDE = {"network-slow": "communicator"}
ALL_RANKS = -1  # the truth's rank of a job-wide fault
WARMUP = 2  # first steps: start-up, not a baseline
# The function that burns the time, per place of the host hotspot.
HOTSPOT_CULPRIT = {"loop": "slow_augment", "loss": "label_penalty", "worker": "augment_sample"}
# (input width, hidden widths) of each model size.
MODELS = {"small": (64, [256, 256]), "large": (128, [512, 512, 512])}


def parse_fault(text, ranks, steps, num_workers=0):
    if text in ("", "none"):
        return {"kind": "none"}
    kind, _, rest = text.partition(":")
    if kind not in LAYERS:
        raise ValueError("unknown or unsupported fault kind '%s' (here: none, %s)" % (kind, ", ".join(LAYERS)))
    f = {"kind": kind, "rank": None, "start_step": max(1, steps // 10), "ms": 40.0, "factor": 2.0, "hogs": 2,
         "quota_pct": 30, "rate_mbit": 40, "where": "loop", "rate": 20000, "filters": 2000}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        if key not in f or key == "kind" or (key == "where" and kind != "host-hotspot"):
            raise ValueError("fault %s has no option '%s'" % (kind, key))
        if key == "rank" and value == "all":
            if kind not in JOB_WIDE:
                raise ValueError("fault %s takes no rank=all (only %s)" % (kind, ", ".join(JOB_WIDE)))
            f["rank"] = ALL_RANKS
            continue
        try:
            if key == "where":
                if value not in HOTSPOT_CULPRIT:
                    raise ValueError
                f[key] = value
            else:
                f[key] = float(value) if key in ("ms", "factor", "quota_pct", "rate_mbit") else int(value)
                if key in ("rate", "filters") and not 0 < f[key] <= (1000000 if key == "rate" else 50000):
                    raise ValueError
        except ValueError:
            raise ValueError("fault %s: bad value '%s' for %s" % (kind, value, key)) from None
    if f["rank"] is None or not (0 <= f["rank"] < ranks or f["rank"] == ALL_RANKS):
        raise ValueError("fault %s needs rank=R with R in 0..%d%s" % (kind, ranks - 1, " (or rank=all)" if kind in JOB_WIDE else ""))
    if f["where"] == "worker" and num_workers == 0:
        raise ValueError("host-hotspot where=worker needs --num-workers > 0")
    return f


def load_batch(step, batch, scale, width):
    g = torch.Generator().manual_seed(step)
    n = int(batch * scale)
    return torch.randn(n, width, generator=g), torch.randint(0, 10, (n,), generator=g)


def slow_augment(x, ms):
    end = time.perf_counter() + ms / 1000.0
    while time.perf_counter() < end:  # the hotspot: CPU work on the critical path
        x = x * 1.0001
    return x


def label_penalty(out, ms):
    """A hand-written regularizer in plain Python: the interpreter's own loop burns the time (no
    torch op), a constant folded into the loss."""
    end = time.perf_counter() + ms / 1000.0
    acc, i = 0.0, 0
    while time.perf_counter() < end:
        for _ in range(200):
            i += 1
            acc += (i % 7) * 1e-9
    return acc * 0.0


def augment_sample(x, ms):
    """The worker's augmentation: torch ops on the batch in the DataLoader worker process."""
    end = time.perf_counter() + ms / 1000.0
    while time.perf_counter() < end:
        x = x * 1.0001
    return x


class Batches(torch.utils.data.Dataset):
    """Batch `step` of a rank, for a DataLoader (batch_size=None: one item is one batch). The
    fault's batch size and the worker's hotspot apply here, in whichever process loads the batch."""

    def __init__(self, steps, width, fault, culprit):
        self.steps, self.width, self.fault, self.culprit = steps, width, fault, culprit

    def __len__(self):
        return self.steps

    def __getitem__(self, step):
        faulty = self.culprit and step >= self.fault.get("start_step", 1 << 30)
        scale = self.fault["factor"] if faulty and self.fault["kind"] == "workload-imbalance" else 1.0
        x, y = load_batch(step, 256, scale, self.width)
        if faulty and self.fault["kind"] == "host-hotspot" and self.fault["where"] == "worker":
            x = augment_sample(x, self.fault["ms"])
        return x, y


def forward(model, x):
    return model(x)


def backward(loss):
    loss.backward()  # DDP all-reduces gradient buckets over gloo here


def optimizer_step(opt):
    opt.step()
    opt.zero_grad()


def cpu_cgroup(name):
    """A cgroup for a CPU quota: cgroup v2 where the unified hierarchy has the cpu controller, else
    the v1 cpu hierarchy; under this process's own cgroup. Returns (dir, v2)."""
    own = {}
    for line in open("/proc/self/cgroup"):
        _, ctrls, path = line.strip().split(":", 2)
        for c in ctrls.split(","):
            own[c] = path
    ctl = "/sys/fs/cgroup/cgroup.controllers"
    if os.path.exists(ctl) and "cpu" in open(ctl).read().split():
        parent = "/sys/fs/cgroup" + own.get("", "/")
        with open(parent.rstrip("/") + "/cgroup.subtree_control", "w") as f:
            f.write("+cpu")
        d, v2 = parent.rstrip("/") + "/" + name, True
    else:
        d, v2 = "/sys/fs/cgroup/cpu" + own.get("cpu", "/").rstrip("/") + "/" + name, False
    os.makedirs(d, exist_ok=True)
    return d, v2


def throttle_self(cgroup, v2, quota_pct):
    """Joins the quota'd cgroup (every thread: cgroup.procs moves the whole process)."""
    period = 100000
    quota = max(1000, int(quota_pct * period / 100))
    if v2:
        open(cgroup + "/cpu.max", "w").write("%d %d" % (quota, period))
    else:
        open(cgroup + "/cpu.cfs_period_us", "w").write(str(period))
        open(cgroup + "/cpu.cfs_quota_us", "w").write(str(quota))
    open(cgroup + "/cgroup.procs", "w").write(str(os.getpid()))


def in_netns(netns, cmd):
    """cmd run in network namespace `netns` (None: this process's own)."""
    return (["ip", "netns", "exec", netns] if netns else []) + cmd


class SlowLink:
    """The links of network-slow: every rank runs in a network namespace of its own behind a veth
    pair whose other end is a port of one bridge in a namespace of its own (the fabric's switch), as
    the ranks of a real job sit on nodes of their own behind one fabric. Every rank's gloo and store
    traffic goes over the veth addresses (GLOO_SOCKET_IFNAME, MASTER_ADDR), so the links carry all of
    it, and nothing in the host's own namespace changes (no forwarding turned on, no device). At the
    fault's start a tbf limits both ends of each slowed link (what the rank sends and what it
    receives):
    - one culprit (rank=R): R's link alone; rank to rank elsewhere crosses two healthy links, so a
      connection that does not touch R is as fast as the healthy fabric. (An earlier layout gave only
      the culprit a namespace, the others sharing one host address: every connection that crossed a
      link then touched the culprit, a shape no real cluster has, that a rule could learn.)
    - every rank (rank=all, ALL_RANKS): every link, so rank to rank crosses two limited links.
    Names carry this process's pid. close() removes the namespaces (their veths and the bridge go
    with them); so does a watcher process in a session of its own when this process dies without
    running close() (a bench's timeout SIGKILLs the job's session), so no run leaves them behind."""

    def __init__(self, rank, world):
        tag = str(os.getpid())
        self.every = rank == ALL_RANKS
        slowed = set(range(world)) if self.every else {rank}
        subnet = "10.232.%d." % (20 + os.getpid() % 200)
        if world > 250:
            raise ValueError("network-slow takes at most 250 ranks (one /24 of veth addresses)")
        switch = "strata-ddp-%s-sw" % tag
        self.namespaces = ["strata-ddp-%s-r%d" % (tag, r) for r in range(world)] + [switch]
        # Per rank: (its namespace, the device its gloo traffic goes out of, its address).
        self.nets = {}
        self.ends = []  # (namespace, device): both ends of every limited link
        self.watcher = None
        try:
            self._watch()
            cmds = [["ip", "netns", "add", switch],
                    in_netns(switch, ["ip", "link", "add", "sw", "type", "bridge"]),
                    in_netns(switch, ["ip", "link", "set", "sw", "up"])]
            for r in range(world):
                netns = self.namespaces[r]
                outer, inner = "dv%sr%dh" % (tag, r), "dv%sr%dn" % (tag, r)
                ip = subnet + str(r + 1)
                cmds += [["ip", "netns", "add", netns],
                         ["ip", "link", "add", outer, "netns", switch,
                          "type", "veth", "peer", "name", inner, "netns", netns],
                         in_netns(netns, ["ip", "addr", "add", ip + "/24", "dev", inner]),
                         in_netns(netns, ["ip", "link", "set", inner, "up"]),
                         in_netns(netns, ["ip", "link", "set", "lo", "up"]),
                         in_netns(switch, ["ip", "link", "set", outer, "master", "sw"]),
                         in_netns(switch, ["ip", "link", "set", outer, "up"])]
                self.nets[r] = (netns, inner, ip)
                if r in slowed:
                    self.ends += [(switch, outer), (netns, inner)]
            for cmd in cmds:
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        except BaseException:
            self.close()
            raise

    def cleanup_cmds(self):
        """What removes everything made: each namespace (its devices go with it: a veth pair goes when
        either end does)."""
        return [["ip", "netns", "del", n] for n in self.namespaces]

    def _watch(self):
        """Starts the watcher (watch_cleanup) of cleanup_cmds."""
        self.watcher = watch_cleanup(self.cleanup_cmds())

    def of_rank(self, rank):
        """What rank `rank` runs with: (MASTER_ADDR: rank 0's address, where the store is; its namespace;
        GLOO_SOCKET_IFNAME)."""
        return (self.nets[0][2],) + self.nets[rank][:2]

    def limit(self, rate_mbit):
        tbf = ["root", "tbf", "rate", "%gmbit" % rate_mbit, "burst", "32kb", "latency", "400ms"]
        for netns, dev in self.ends:
            subprocess.run(in_netns(netns, ["tc", "qdisc", "add", "dev", dev] + tbf), check=True)

    def close(self):
        for cmd in self.cleanup_cmds():
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if self.watcher:
            self.watcher.stdin.close()
            self.watcher.wait()
            self.watcher = None


def watch_cleanup(cmds):
    """A watcher process that reads its stdin, whose only writer is this process, to the end (this
    process closed it or died), then runs `cmds`. In a session of its own: a kill of the job's session
    spares it."""
    script = ("import json, subprocess, sys\nsys.stdin.buffer.read()\n"
              "for c in json.loads(sys.argv[1]):\n"
              "    subprocess.run(c, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n")
    return subprocess.Popen([sys.executable, "-c", script, json.dumps(cmds)], stdin=subprocess.PIPE, start_new_session=True)


# The sender of irq-softirq: small UDP packets to a port nothing listens on and no filter matches,
# paced to argv[1] a second, 64 to a sendmmsg(2) call (through ctypes: the Python around each
# packet would cost the sender's CPU, the culprit's peers' CPU, more than the receive work costs the
# culprit's); it dies with the job (PR_SET_PDEATHSIG).
IRQ_SENDER = """
import ctypes, signal, socket, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(1, signal.SIGKILL, 0, 0, 0)
rate = float(sys.argv[1])
class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
class MsgHdr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32), ("iov", ctypes.POINTER(IoVec)),
                ("iovlen", ctypes.c_size_t), ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                ("flags", ctypes.c_int)]
class MMsgHdr(ctypes.Structure):
    _fields_ = [("hdr", MsgHdr), ("len", ctypes.c_uint)]
BATCH = 64
payload = ctypes.create_string_buffer(16)
iov = IoVec(ctypes.cast(payload, ctypes.c_void_p), 16)
to = ctypes.create_string_buffer(struct.pack("=HH4s8x", socket.AF_INET, socket.htons(9), socket.inet_aton("127.0.0.1")), 16)
msgs = (MMsgHdr * BATCH)()
for m in msgs:
    m.hdr.name, m.hdr.namelen, m.hdr.iov, m.hdr.iovlen = ctypes.cast(to, ctypes.c_void_p), 16, ctypes.pointer(iov), 1
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
n, t0 = 0, time.monotonic()
while True:
    got = libc.sendmmsg(s.fileno(), msgs, BATCH, 0)
    n += got if got > 0 else BATCH
    d = t0 + n / rate - time.monotonic()
    if d > 0:
        time.sleep(d)
"""


class IrqSteer:
    """The receive work of irq-softirq, as strata-sim's (testbed/sim/faults.cpp): a network namespace
    whose loopback steers every packet it receives to CPU `cpu` with RPS, each packet walking
    `filters` tc u32 filters on ingress, so NET_RX softirq runs on that CPU, stealing from whatever
    is current there (a NIC queue's interrupts and RPS aimed at a training core). start() runs the
    sender on another CPU; close() (or the watcher, if this process dies first) removes it all."""

    def __init__(self, cpu, filters):
        self.netns = "strata-ddp-%d-irq" % os.getpid()
        self.cpu = cpu
        self.sender = None
        self.watcher = watch_cleanup([["ip", "netns", "del", self.netns]])
        try:
            # The sysfs cpumask format (as strata-sim writes it): 32-bit hex words, highest first,
            # comma-separated; one word of more than 8 digits is refused past CPU 31.
            words = [(1 << cpu % 32) if w == cpu // 32 else 0 for w in range((os.cpu_count() - 1) // 32, -1, -1)]
            mask = ",".join("%08x" % w for w in words)
            batch = "".join("filter add dev lo parent ffff: protocol ip prio 1 u32 match ip dport %d 0xffff classid 1:1\n"
                            % (10000 + i % 50000) for i in range(filters))
            for cmd in (["ip", "netns", "add", self.netns], in_netns(self.netns, ["ip", "link", "set", "lo", "up"]),
                        in_netns(self.netns, ["sh", "-c", "echo %s > /sys/class/net/lo/queues/rx-0/rps_cpus" % mask]),
                        in_netns(self.netns, ["tc", "qdisc", "add", "dev", "lo", "ingress"])):
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            subprocess.run(in_netns(self.netns, ["tc", "-batch", "-"]), input=batch.encode(), check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        except BaseException:
            self.close()
            raise

    def start(self, rate):
        other = 0 if self.cpu != 0 else 1
        self.sender = subprocess.Popen(in_netns(self.netns, ["taskset", "-c", str(other), sys.executable, "-c", IRQ_SENDER,
                                                             str(rate)]))

    def close(self):
        if self.sender:
            self.sender.kill()
            self.sender.wait()
            self.sender = None
        subprocess.run(["ip", "netns", "del", self.netns], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if self.watcher:
            self.watcher.stdin.close()
            self.watcher.wait()
            self.watcher = None


def enter_netns(name):
    """Moves this (still single-threaded) process into network namespace `name` (setns(2))."""
    fd = os.open("/var/run/netns/" + name, os.O_RDONLY)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
        raise OSError(ctypes.get_errno(), "setns " + name)
    os.close(fd)


def rank_main(rank, world, steps, fault, port, queue, cgroup=None, link=None, variant=None):
    variant = variant or {"model": "small", "pin": False, "num_workers": 0}
    master = link[0] if link else "127.0.0.1"
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR=master, MASTER_PORT=str(port))
    if link:
        _, netns, ifname = link
        if netns:
            enter_netns(netns)
        os.environ["GLOO_SOCKET_IFNAME"] = ifname
    torch.set_num_threads(1)
    ncpu = os.cpu_count()
    if variant["pin"] and fault["kind"] != "cpu-contention":
        os.sched_setaffinity(0, {rank % ncpu})
    if fault["kind"] == "irq-softirq" and not variant["pin"] and ncpu > 1:
        # The culprit on the CPU the receive work is steered to (as a launcher binds a rank to a
        # core), its peers on the others: unpinned, every rank would take turns on that CPU.
        irq_cpu = fault["rank"] % ncpu
        os.sched_setaffinity(0, {irq_cpu} if rank == fault["rank"] else set(range(ncpu)) - {irq_cpu})
    if fault["kind"] == "cpu-contention":
        # The culprit alone on the hogs' CPU, its peers on the others: else a peer sharing that CPU
        # is a victim too.
        hog_cpu, ncpu = os.cpu_count() - 1, os.cpu_count()
        os.sched_setaffinity(0, {hog_cpu} if rank == fault["rank"] or ncpu == 1 else set(range(ncpu)) - {hog_cpu})
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    width, hidden = MODELS[variant["model"]]
    layers, prev = [], width
    for h in hidden:
        layers += [torch.nn.Linear(prev, h), torch.nn.ReLU()]
        prev = h
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers, torch.nn.Linear(prev, 10)),
                                                      bucket_cap_mb=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    culprit = fault.get("rank") == rank
    data = Batches(steps, width, fault, culprit)
    batches = None
    if variant["num_workers"] > 0:
        batches = iter(torch.utils.data.DataLoader(data, batch_size=None, shuffle=False,
                                                   num_workers=variant["num_workers"]))
    for step in range(steps):
        faulty = culprit and step >= fault.get("start_step", 1 << 30)
        if faulty and fault["kind"] == "cpu-throttling" and step == fault["start_step"]:
            throttle_self(cgroup[0], cgroup[1], fault["quota_pct"])
        t0 = time.perf_counter()
        x, y = next(batches) if batches is not None else data[step]
        if faulty and fault["kind"] == "host-hotspot" and fault["where"] == "loop":
            x = slow_augment(x, fault["ms"])
        t1 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(forward(model, x), y)
        if faulty and fault["kind"] == "host-hotspot" and fault["where"] == "loss":
            loss = loss + label_penalty(loss, fault["ms"])
        backward(loss)
        optimizer_step(opt)
        t2 = time.perf_counter()
        queue.put((rank, step, (t2 - t0) * 1000, (t1 - t0) * 1000))
    del batches  # the DataLoader's workers stop here, before the rank exits
    dist.destroy_process_group()
    # Exit at once, as a finished rank does: torch's interpreter teardown takes seconds on a busy
    # machine, and a rank that lingers that long after its last step looks hung.
    queue.close()
    queue.join_thread()
    os._exit(0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--fault", default="none")
    ap.add_argument("--truth", default="")
    ap.add_argument("--model", choices=sorted(MODELS), default="small", help="MLP size (default small)")
    ap.add_argument("--pin", action="store_true", help="pin each rank (and its workers) to CPU rank %% CPUs")
    ap.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes per rank (default 0)")
    a = ap.parse_args()
    if a.num_workers < 0:
        print("ddp_train: --num-workers must be >= 0", file=sys.stderr)
        return 1
    variant = {"model": a.model, "pin": a.pin, "num_workers": a.num_workers}
    try:
        fault = parse_fault(a.fault, a.ranks, a.steps, a.num_workers)
    except ValueError as e:
        print("ddp_train: %s" % e, file=sys.stderr)
        return 1
    hogs = []

    def start_hogs():
        # As strata-sim's hogs, from the fault's start: a session of their own (autogroup
        # scheduling weighs sessions) at nice -15, so the culprit's short CPU bursts cannot hide
        # behind wake-up credit, on the CPU the culprit alone is pinned to.
        def higher_priority():
            try:
                with open("/proc/self/autogroup", "w") as f:
                    f.write("-15")
            except OSError:
                pass
            os.nice(-15)
            # A hog dies with the job that started it (PR_SET_PDEATHSIG, SIGKILL): a job killed
            # from outside (a bench's timeout) must not leave two CPUs burning at nice -15.
            ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:
                os._exit(0)

        parent = os.getpid()
        for _ in range(fault["hogs"]):
            hogs.append(subprocess.Popen(["taskset", "-c", str(os.cpu_count() - 1), sys.executable, "-c",
                                          "import ctypes;ctypes.CDLL(None).prctl(15,b'strata-hog',0,0,0)\nwhile True: pass"],
                                         start_new_session=True, preexec_fn=higher_priority))

    cgroup = None
    # A SIGTERM or SIGHUP ends the job through the finally below (ranks, hogs, links, cgroup go).
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _: sys.exit(128 + signum))
    slow_link = None
    if fault["kind"] == "network-slow":
        try:
            slow_link = SlowLink(fault["rank"], a.ranks)
        except (OSError, ValueError, subprocess.CalledProcessError) as e:
            why = e.stderr.decode(errors="replace").strip() if getattr(e, "stderr", None) else str(e)
            print("ddp_train: network-slow needs root and network namespaces (ip netns, veth, bridge): %s" % why,
                  file=sys.stderr)
            return 2
    irq = None
    if fault["kind"] == "irq-softirq":
        if os.cpu_count() < 2:
            print("ddp_train: irq-softirq needs 2 CPUs (the sender runs beside the culprit's CPU)", file=sys.stderr)
            return 2
        try:
            irq = IrqSteer(fault["rank"] % os.cpu_count(), fault["filters"])
        except (OSError, subprocess.CalledProcessError) as e:
            why = e.stderr.decode(errors="replace").strip() if getattr(e, "stderr", None) else str(e)
            print("ddp_train: irq-softirq needs root, network namespaces, tc and RPS: %s" % why, file=sys.stderr)
            return 2
    links = [slow_link.of_rank(r) if slow_link else None for r in range(a.ranks)]
    # The rank whose step start_step - 1 starts the fault: the culprit, or rank 0 when every rank is.
    trigger = 0 if fault.get("rank") == ALL_RANKS else fault.get("rank")
    if fault["kind"] == "cpu-throttling":
        cgroup = cpu_cgroup("strata-ddp-%d-r%d" % (os.getpid(), fault["rank"]))
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, a.ranks, a.steps, fault, port, queue, cgroup, links[r], variant))
             for r in range(a.ranks)]
    job = os.environ.get("STRATA_JOB") or "ddp-train-%d" % os.getpid()
    saved = dict(os.environ)
    try:
        for r, p in enumerate(procs):
            # A spawned process starts with os.environ as it is now: its identity from exec on.
            os.environ.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(a.ranks),
                              MASTER_ADDR=links[r][0] if slow_link else "127.0.0.1", MASTER_PORT=str(port),
                              STRATA_JOB=job)
            p.start()
        os.environ.clear()
        os.environ.update(saved)
        if fault.get("rank") is not None and fault.get("start_step", 1) <= 0:
            # From the first step: in place before any rank trains (the loop below applies a
            # later start when the culprit reports the step before it).
            if slow_link:
                slow_link.limit(fault["rate_mbit"])
            if fault["kind"] == "cpu-contention":
                start_hogs()
            if irq:
                irq.start(fault["rate"])
        stats = {r: [] for r in range(a.ranks)}
        for _ in range(a.ranks * a.steps):
            r, step, step_ms, load_ms = queue.get(timeout=300)
            stats[r].append((step, step_ms, load_ms))
            if r == trigger and step == fault["start_step"] - 1:
                if slow_link:
                    slow_link.limit(fault["rate_mbit"])
                if fault["kind"] == "cpu-contention":
                    start_hogs()
                if irq:
                    irq.start(fault["rate"])
        for p in procs:
            p.join()
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        for p in procs:
            if p.is_alive():
                p.kill()
        if slow_link:
            slow_link.close()
        if irq:
            irq.close()
        if cgroup:
            try:
                os.rmdir(cgroup[0])
            except OSError:
                pass
    start = fault.get("start_step", 0) if fault["kind"] != "none" else 0
    per_rank = []
    for r in range(a.ranks):
        win = [s for s in stats[r] if s[0] >= start] or stats[r]
        m = lambda i: sum(s[i] for s in win) / len(win)
        base = [s for s in stats[r] if WARMUP <= s[0] < start] if start > WARMUP else []
        b = lambda i: sum(s[i] for s in base) / len(base)
        per_rank.append({"rank": r, "pid": procs[r].pid, "steps_done": len(stats[r]),
                         "fault_window": {"step_ms": m(1), "load_ms": m(2)},
                         "baseline": {"step_ms": b(1), "load_ms": b(2)} if base else None})
        print("rank %d pid %d step_ms %.1f load_ms %.1f" % (r, procs[r].pid, m(1), m(2)) +
              (" (before start_step: step_ms %.1f)" % b(1) if base else ""))
    truth = {"ranks": a.ranks, "steps": a.steps, "program": "pytorch-ddp-gloo", "job": job, "variant": variant,
             "pids": {str(r): procs[r].pid for r in range(a.ranks)}, "per_rank": per_rank,
             "fault": {"kind": fault["kind"]}}
    if fault["kind"] != "none":
        layer, cause, culprit = LAYERS[fault["kind"]]
        if fault["kind"] == "host-hotspot":
            culprit = HOTSPOT_CULPRIT[fault["where"]]
        job_wide = fault["rank"] == ALL_RANKS
        truth["fault"].update(scope="job" if job_wide else "rank", rank=fault["rank"], layer=layer, cause=cause,
                              culprit=JOB_WIDE[fault["kind"]] if job_wide else culprit % {"rank": fault["rank"]},
                              start_step=fault["start_step"],
                              params={k: fault[k] for k in ("ms", "factor", "hogs", "quota_pct", "rate_mbit", "where")})
        if fault["kind"] == "irq-softirq":
            # Every rank on the CPU the work is steered to suffers it (pinned: rank r on r % CPUs).
            ncpu = os.cpu_count()
            on = [r for r in range(a.ranks) if r % ncpu == fault["rank"] % ncpu] if a.pin else [fault["rank"]]
            truth["fault"].update(ranks=on, params={k: fault[k] for k in ("rate", "filters")},
                                  details={"cpu": str(fault["rank"] % ncpu), "netns": irq.netns})
    if a.truth:
        with open(a.truth, "w") as f:
            json.dump(truth, f, indent=1)
    return 0 if all(p.exitcode == 0 for p in procs) else 3


if __name__ == "__main__":
    sys.exit(main())
