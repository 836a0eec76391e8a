// A TCP port for `strata serve --listen` that nothing listens on now, drawn at random from below the
// kernel's ephemeral range (as strata::free_listen_port in common/listen.h does): a port the kernel
// picks for listen(0) is ephemeral, and an outgoing connection (the browser's, another test's) may
// take it before the server binds it.
import fs from 'node:fs';
import net from 'node:net';

function candidateRange() {
  let lo = 20000;
  let hi = 32767;
  try {
    const [ephLo, ephHi] = fs.readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/).map(Number);
    hi = ephLo - 1;
    if (hi - lo < 1000) [lo, hi] = [ephHi + 1, 65535];
  } catch {
    // not Linux's procfs: the defaults below 32768
  }
  return [lo, hi];
}

function canListen(port) {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.once('error', () => resolve(false));
    s.listen(port, '0.0.0.0', () => s.close(() => resolve(true)));
  });
}

export async function freePort() {
  const [lo, hi] = candidateRange();
  for (let i = 0; i < 200; i++) {
    const port = lo + Math.floor(Math.random() * (hi - lo + 1));
    if (await canListen(port)) return port;
  }
  throw new Error('no free TCP port');
}
