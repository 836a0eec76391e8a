// One of many distinct shared libraries for the unwind-table budget test, built once per MOD
// (-DMOD=N): 400 filler functions that each save six callee-saved registers (a dozen CFI rows
// apiece, ~60 KB of unwind table per module) and a chain modN_run -> modN_a -> modN_b ->
// modN_leaf, all without frame pointers, so only CFI unwinding walks through it. The filler makes
// the table big; the build id differs per MOD because the code does.
#include <time.h>

#define CAT3_(a, b, c) a##b##c
#define CAT3(a, b, c) CAT3_(a, b, c)
#define NAME(x) CAT3(mod, MOD, x)

volatile int strata_mod_g[8];
void (*volatile strata_mod_sink)(void);

// Six values loaded before a call that might change them, used after it: six registers saved.
#define F(n)                                                                                     \
  __attribute__((noinline)) int NAME(_f##n)(int x) {                                             \
    int a = strata_mod_g[0] * x, b = strata_mod_g[1] + x, c = strata_mod_g[2] ^ x,               \
        d = strata_mod_g[3] - x, e = strata_mod_g[4] * n, f = strata_mod_g[5] + n + MOD;         \
    if (strata_mod_sink) strata_mod_sink();                                                      \
    return a + b * 3 + c * 5 + d * 7 + e * 11 + f * 13;                                          \
  }
#define D(n) F(n##0) F(n##1) F(n##2) F(n##3) F(n##4) F(n##5) F(n##6) F(n##7) F(n##8) F(n##9)
#define C(n) D(n##0) D(n##1) D(n##2) D(n##3) D(n##4) D(n##5) D(n##6) D(n##7) D(n##8) D(n##9)
C(1) C(2) C(3) C(4)

// CPU time of the thread: the samples a module gets depend on the work done in it, not on how
// busy the machine is.
static long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

__attribute__((noinline)) long NAME(_leaf)(long until_ns) {
  long n = 0;
  while (now_ns() < until_ns) {
    for (int i = 0; i < 200000; i++) n += i ^ MOD;  // ~0.1 ms between clock reads (a system call)
    __asm__ volatile("" : "+r"(n));
  }
  return n;
}
__attribute__((noinline)) long NAME(_b)(long until_ns) { return NAME(_leaf)(until_ns) + strata_mod_g[6]; }
__attribute__((noinline)) long NAME(_a)(long until_ns) { return NAME(_b)(until_ns) + strata_mod_g[7]; }
// Spins for spin_ns of CPU time inside this module.
long NAME(_run)(long spin_ns) { return NAME(_a)(now_ns() + spin_ns) + 1; }
