// LD_PRELOAD shim for the clock-jump test: makes CLOCK_REALTIME (clock_gettime, gettimeofday,
// time) of the process it is loaded in jump, without touching the machine's clock (shared).
//
//   STRATA_CLOCK_JUMPS="AFTER_S:DELTA_S[,AFTER_S:DELTA_S...]"   e.g. "3:+3600,6:-7200"
//
// AFTER_S counts on CLOCK_MONOTONIC from the first clock call of the process; each jump adds its
// DELTA_S to the wall clock from then on (so the example runs an hour ahead from 3 s, an hour
// behind from 6 s). Each jump, when first seen, is announced on stderr. CLOCK_MONOTONIC and
// CLOCK_BOOTTIME are untouched, as a real step of the wall clock leaves them.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define MAX_JUMPS 16

static struct {
  long long after_ns;
  long long delta_ns;
  int announced;
} jumps[MAX_JUMPS];
static int njumps = -1;  // -1: not parsed yet
static long long t0_ns;

// The real clock, straight from the kernel: no recursion into ourselves, no dlsym at early start.
static int raw_clock(clockid_t id, struct timespec* ts) { return (int)syscall(SYS_clock_gettime, id, ts); }

static long long mono_ns(void) {
  struct timespec ts;
  raw_clock(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void parse(void) {
  // Racy only in that two threads may both parse the same string to the same result.
  int n = 0;
  const char* spec = getenv("STRATA_CLOCK_JUMPS");
  t0_ns = mono_ns();
  while (spec && *spec && n < MAX_JUMPS) {
    char* end;
    double after = strtod(spec, &end);
    if (*end != ':') break;
    double delta = strtod(end + 1, &end);
    jumps[n].after_ns = (long long)(after * 1e9);
    jumps[n].delta_ns = (long long)(delta * 1e9);
    n++;
    if (*end != ',') break;
    spec = end + 1;
  }
  __atomic_store_n(&njumps, n, __ATOMIC_RELEASE);
}

static long long offset_ns(void) {
  if (__atomic_load_n(&njumps, __ATOMIC_ACQUIRE) < 0) parse();
  long long elapsed = mono_ns() - t0_ns, off = 0;
  for (int i = 0; i < njumps; i++) {
    if (elapsed < jumps[i].after_ns) continue;
    off += jumps[i].delta_ns;
    if (!__atomic_exchange_n(&jumps[i].announced, 1, __ATOMIC_ACQ_REL)) {
      char msg[96];
      int len = snprintf(msg, sizeof msg, "clockjump: pid %d: wall clock %+lld s\n", (int)getpid(),
                         jumps[i].delta_ns / 1000000000LL);
      if (len > 0) (void)!write(2, msg, (size_t)len);
    }
  }
  return off;
}

static void shift(struct timespec* ts, long long off) {
  long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + off;
  ts->tv_sec = (time_t)(ns / 1000000000LL);
  ts->tv_nsec = (long)(ns % 1000000000LL);
  if (ts->tv_nsec < 0) {
    ts->tv_nsec += 1000000000L;
    ts->tv_sec -= 1;
  }
}

int clock_gettime(clockid_t id, struct timespec* ts) {
  int r = raw_clock(id, ts);
  if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) shift(ts, offset_ns());
  return r;
}

int __clock_gettime(clockid_t id, struct timespec* ts) { return clock_gettime(id, ts); }

int gettimeofday(struct timeval* tv, void* tz) {
  (void)tz;
  struct timespec ts;
  int r = clock_gettime(CLOCK_REALTIME, &ts);
  if (r == 0) {  // tv: declared nonnull by glibc
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
  }
  return r;
}

time_t time(time_t* out) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  if (out) *out = ts.tv_sec;
  return ts.tv_sec;
}
