#!/usr/bin/env python3
"""rusage_run.py PIDFILE OUTFILE -- CMD [ARGS...]

Runs CMD as a child, writes its pid to PIDFILE at once, forwards SIGINT/SIGTERM to it, and when it
exits writes "exit=N user_s=U sys_s=S" (its own CPU and that of its reaped children, microsecond
resolution, from wait4) to OUTFILE. Exits with CMD's exit status."""
import os
import signal
import sys


def main():
    if len(sys.argv) < 5 or sys.argv[3] != "--":
        print(__doc__.strip(), file=sys.stderr)
        return 2
    pidfile, outfile, cmd = sys.argv[1], sys.argv[2], sys.argv[4:]
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            os.execvp(cmd[0], cmd)
        except OSError as e:
            print(f"rusage_run: cannot run {cmd[0]}: {e.strerror}", file=sys.stderr)
            os._exit(127)

    def forward(sig, _frame):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    tmp = pidfile + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{pid}\n")
    os.rename(tmp, pidfile)
    while True:
        try:
            _, status, ru = os.wait4(pid, 0)
            break
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    with open(outfile, "w") as f:
        f.write(f"exit={code} user_s={ru.ru_utime:.6f} sys_s={ru.ru_stime:.6f}\n")
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
