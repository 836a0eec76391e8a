// Threads that block in known places, for the off-CPU tests: nanosleep, a blocking read on a pipe, a
// futex wait. Each measures the wall time it spent inside its blocking call and main prints the sums
// (microseconds) at the end:
//   nanosleep_us N / pipe_us N / futex_us N
// The blocking call sits one frame below the named function (libc's syscall wrappers keep no frame
// pointer, so the frame-pointer unwinder skips their direct caller; the named function stays visible).
// With `bursty`, a fourth thread (sl-bursty) sleeps 50 us twelve times, then 4 ms, over and over: a
// thread that blocks long now and then among many short blocks (a communication library's helper),
// whose long blocks are not wanted for a capture at switch-out and go with the kernel stack only.
// It adds, for its long sleeps only:
//   bursty_long_us N
// usage: sleeper [SECONDS] [bursty]
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double g_seconds = 2;
static int g_pipe[2];
static atomic_int g_futex;
static atomic_int g_stop;
static uint64_t g_nanosleep_ns, g_pipe_ns, g_futex_ns, g_bursty_long_ns;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

__attribute__((noinline)) static void nanosleep_site(void) {
  struct timespec ts = {0, 20 * 1000 * 1000};
  nanosleep(&ts, NULL);
}

__attribute__((noinline)) void sleep_in_nanosleep(void) {
  while (!atomic_load(&g_stop)) {
    uint64_t t0 = now_ns();
    nanosleep_site();
    g_nanosleep_ns += now_ns() - t0;
  }
}

__attribute__((noinline)) static long pipe_read_site(char* c) {
  volatile long n = read(g_pipe[0], c, 1);  // not a tail call: this frame must stay on the stack
  return n;
}

__attribute__((noinline)) void block_in_pipe_read(void) {
  for (;;) {
    char c = 0;
    uint64_t t0 = now_ns();
    long n = pipe_read_site(&c);
    g_pipe_ns += now_ns() - t0;
    if (n <= 0 || c == 'q') break;
  }
}

__attribute__((noinline)) static void futex_wait_site(void) {
  syscall(SYS_futex, &g_futex, FUTEX_WAIT_PRIVATE, 0, NULL, NULL, 0);
}

__attribute__((noinline)) void wait_on_futex(void) {
  while (!atomic_load(&g_stop)) {
    uint64_t t0 = now_ns();
    futex_wait_site();
    g_futex_ns += now_ns() - t0;
    atomic_store(&g_futex, 0);
  }
}

static void sleep_us(long us) {
  struct timespec ts = {0, us * 1000};
  nanosleep(&ts, NULL);
}

static void* bursty_thread(void* arg) {
  (void)arg;
  prctl(PR_SET_NAME, "sl-bursty");
  while (!atomic_load(&g_stop)) {
    for (int i = 0; i < 12; i++) sleep_us(50);
    uint64_t t0 = now_ns();
    sleep_us(4000);
    g_bursty_long_ns += now_ns() - t0;
  }
  return NULL;
}

static void* nanosleep_thread(void* arg) {
  (void)arg;
  prctl(PR_SET_NAME, "sl-nanosleep");
  sleep_in_nanosleep();
  return NULL;
}

static void* pipe_thread(void* arg) {
  (void)arg;
  prctl(PR_SET_NAME, "sl-pipe");
  block_in_pipe_read();
  return NULL;
}

static void* futex_thread(void* arg) {
  (void)arg;
  prctl(PR_SET_NAME, "sl-futex");
  wait_on_futex();
  return NULL;
}

// Wakes the pipe reader every 30 ms and the futex waiter every 25 ms (to within 5 ms).
static void drive(void) {
  uint64_t end = now_ns() + (uint64_t)(g_seconds * 1e9);
  uint64_t next_pipe = now_ns() + 30000000ull, next_futex = now_ns() + 25000000ull;
  while (now_ns() < end) {
    uint64_t t = now_ns();
    if (t >= next_pipe) {
      (void)!write(g_pipe[1], "x", 1);
      next_pipe += 30000000ull;
    }
    if (t >= next_futex) {
      atomic_store(&g_futex, 1);
      syscall(SYS_futex, &g_futex, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
      next_futex += 25000000ull;
    }
    // 5 ms, not 1: this thread's own blocks stay well below the probe's per-CPU event cap
    // (1000/s), so every block of the measured threads is sent (see offcpu_rate_limited).
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

int main(int argc, char** argv) {
  if (argc > 1) g_seconds = atof(argv[1]);
  if (pipe(g_pipe) != 0) return 1;
  int bursty = argc > 2 && strcmp(argv[2], "bursty") == 0;
  pthread_t a, b, c, d;
  if (bursty) pthread_create(&d, NULL, bursty_thread, NULL);
  pthread_create(&a, NULL, nanosleep_thread, NULL);
  pthread_create(&b, NULL, pipe_thread, NULL);
  pthread_create(&c, NULL, futex_thread, NULL);
  drive();
  atomic_store(&g_stop, 1);
  (void)!write(g_pipe[1], "q", 1);
  atomic_store(&g_futex, 1);
  syscall(SYS_futex, &g_futex, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
  pthread_join(a, NULL);
  pthread_join(b, NULL);
  pthread_join(c, NULL);
  if (bursty) {
    pthread_join(d, NULL);
    printf("bursty_long_us %llu\n", (unsigned long long)(g_bursty_long_ns / 1000));
  }
  printf("nanosleep_us %llu\npipe_us %llu\nfutex_us %llu\n", (unsigned long long)(g_nanosleep_ns / 1000),
         (unsigned long long)(g_pipe_ns / 1000), (unsigned long long)(g_futex_ns / 1000));
  return 0;
}
