#!/usr/bin/python3
"""A PyTorch job over gloo (CPU) that stalls, for the hang rule's end-to-end test
(tests/testbed/gloo_stall_test.py). Run with Debian's /usr/bin/python3 (python3-torch).

  gloo_stall.py --ranks N --steps S --teardown-s T
      every rank runs S steps (a little compute, two all-reduces), completes its last all-reduce,
      then stays alive T s outside every collective (a finished job's slow teardown) and exits;
  gloo_stall.py --ranks N --steps S --hang-rank H --hang-s T
      rank H stops before the all-reduces of step S/2 (sleeps T s, then exits); the other ranks
      enter them and wait inside; when rank H is done the launcher kills them (a watchdog).

Each rank is a process of its own, exec'd with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
STRATA_JOB in its environment (how strata knows a rank). Exit: 0 done, 1 bad usage.
"""
import argparse
import datetime
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
from harness import free_port  # noqa: E402


def rank_main(a):
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    # gloo's own timeout past the stall: the waiting ranks stay inside the all-reduce until killed.
    dist.init_process_group("gloo", rank=rank, world_size=a.ranks,
                            timeout=datetime.timedelta(seconds=a.hang_s + 300))
    grads = [torch.ones(64 * 1024), torch.ones(16 * 1024)]
    w = torch.randn(256, 256)
    for step in range(a.steps):
        if rank == a.hang_rank and step == a.steps // 2:
            time.sleep(a.hang_s)  # stopped in its own code (a deadlock, a loader that never returns)
            os._exit(0)
        x = torch.randn(64, 256)
        for _ in range(20):
            x = torch.tanh(x @ w)
        for g in grads:
            dist.all_reduce(g)
    # The last all-reduce completed on every rank; the teardown (checkpoint, logging, exit) is slow.
    time.sleep(a.teardown_s)
    dist.destroy_process_group()
    os._exit(0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--teardown-s", type=float, default=0)
    ap.add_argument("--hang-rank", type=int, default=-1)
    ap.add_argument("--hang-s", type=float, default=0)
    ap.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.ranks < 2 or a.steps < 2 or a.teardown_s < 0 or a.hang_s < 0 or a.hang_rank >= a.ranks:
        print("gloo_stall: bad arguments", file=sys.stderr)
        return 1
    if a.rank_main:
        return rank_main(a)
    port = free_port()
    job = "gloo-stall-%d" % os.getpid()
    procs = []
    for r in range(a.ranks):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(a.ranks), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), STRATA_JOB=job)
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank-main"] + sys.argv[1:], env=env))
    try:
        if a.hang_rank >= 0:
            procs[a.hang_rank].wait()
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGKILL)
        for p in procs:
            p.wait()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
