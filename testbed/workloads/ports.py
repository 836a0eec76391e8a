"""A TCP port for another process to bind: the rank-0 store of a job the testbed starts, a server a
test starts. Shared by the workloads, the tests' harness and the benches."""
import random
import socket


def free_port():
    """A port nothing listens on now, drawn from below the kernel's ephemeral range (as
    strata::free_listen_port does, common/listen.h): the kernel gives ephemeral ports to outgoing connections too, and
    one may take the port before the process the test starts binds it."""
    lo, hi = 20000, 32767
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            eph_lo, eph_hi = (int(x) for x in f.read().split())
        lo, hi = 20000, eph_lo - 1
        if hi - lo < 1000:
            lo, hi = eph_hi + 1, 65535
    except (OSError, ValueError):
        pass
    for _ in range(200):
        port = random.randint(lo, hi)
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
            s.listen(1)
            return port
        except OSError:
            continue
        finally:
            s.close()
    raise RuntimeError("no free TCP port")
