#!/usr/bin/env python3
"""`strata agent --pod-env` (label unit; no root): what a cluster gives every training container so
the agent reads each rank's GPU device timeline.

- it prints the CUPTI injection environment, one NAME=value a line: CUDA_INJECTION64_PATH names the
  built libstrata_cupti.so, STRATA_TIMELINE_DIR the timeline directory; and, as comments, both as
  host paths to mount; nothing else on stdout, so `env $(strata agent --pod-env | grep -v '^#') CMD`
  works;
- it is what `strata record -- CMD` gives its command (the same two variables, the same values;
  checked when run as root, where record can run);
- with no injection to give (STRATA_CUPTI=0), it exits 2 with a one-line reason on stderr.
Usage: pod_env_test.py BUILD_DIR
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
from harness import check, failures  # noqa: E402

B = os.path.abspath(sys.argv[1])
STRATA = os.path.join(B, "bin", "strata")


def main():
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_INJECTION64_PATH", "STRATA_CUPTI")}
    p = subprocess.run([STRATA, "agent", "--pod-env"], capture_output=True, text=True, env=env)
    check(p.returncode == 0, f"--pod-env: exit {p.returncode} {p.stderr.strip()}")
    lines = p.stdout.splitlines()
    values = dict(l.split("=", 1) for l in lines if l and not l.startswith("#"))
    check(set(values) == {"CUDA_INJECTION64_PATH", "STRATA_TIMELINE_DIR"}, f"the environment: {sorted(values)}")
    lib = values.get("CUDA_INJECTION64_PATH", "")
    check(os.path.isabs(lib) and os.path.isfile(lib) and lib.endswith("libstrata_cupti.so"),
          f"CUDA_INJECTION64_PATH is the built injection library ({lib})")
    tdir = values.get("STRATA_TIMELINE_DIR", "")
    check(os.path.isabs(tdir), f"STRATA_TIMELINE_DIR is an absolute path ({tdir})")
    comments = [l for l in lines if l.startswith("#")]
    check(any(lib in l and "read-only" in l for l in comments), "the library is a read-only host path to mount")
    check(any(tdir in l and "read-write" in l for l in comments), "the timeline directory is a read-write host path")

    # The same as `strata record` gives the command it starts (where record can run: as root).
    if os.geteuid() == 0:
        with tempfile.TemporaryDirectory() as tmp:
            r = subprocess.run([STRATA, "record", "-o", os.path.join(tmp, "env.db"), "--layers", "gpu", "--", "env"],
                               capture_output=True, text=True, env=env)
        child = dict(l.split("=", 1) for l in r.stdout.splitlines() if "=" in l)
        check(all(child.get(k) == v for k, v in values.items()),
              f"record gives its command the same ({ {k: child.get(k) for k in values} })")

    off = dict(env, STRATA_CUPTI="0")
    p = subprocess.run([STRATA, "agent", "--pod-env"], capture_output=True, text=True, env=off)
    err = p.stderr.strip().splitlines()
    check(p.returncode == 2 and len(err) == 1 and p.stdout == "",
          f"no injection to give: exit {p.returncode}, one line: {err}")
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
