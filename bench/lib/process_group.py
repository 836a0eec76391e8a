"""Stopping a benchmark's child processes, each started in a session (process group) of its own."""
import os
import signal
import subprocess

# How long a process group gets to exit after its polite signal before it is killed: an agent or a
# collector flushes its last window and closes its store on SIGINT, which takes seconds on a loaded
# machine, never a minute.
GRACE_S = 60


def stop_group(p, sig, grace_s=GRACE_S):
    """Sends sig to the process group of p (a Popen started with start_new_session=True), waits up to
    grace_s for p to exit, then kills the group. Does nothing for None or a process that has exited."""
    if p is None or p.poll() is not None:
        return
    try:
        os.killpg(p.pid, sig)
        p.wait(grace_s)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:  # the group is gone already
            pass
        p.wait()
