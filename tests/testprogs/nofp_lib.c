/* libstrata_nofp.so for nofp_chain: twelve links without frame pointers, calling back into the
 * executable (exe_07). */
extern volatile unsigned long sink;
void exe_07(int depth);

#define LINK(name, next)                              \
  __attribute__((noinline)) void name(int depth) {   \
    volatile char pad[16 + (depth & 7)];              \
    pad[depth & 7] = (char)depth;                     \
    next(depth + 1);                                  \
    sink += pad[depth & 7];                           \
  }
LINK(lib_12, exe_07)
LINK(lib_11, lib_12)
LINK(lib_10, lib_11)
LINK(lib_09, lib_10)
LINK(lib_08, lib_09)
LINK(lib_07, lib_08)
LINK(lib_06, lib_07)
LINK(lib_05, lib_06)
LINK(lib_04, lib_05)
LINK(lib_03, lib_04)
LINK(lib_02, lib_03)
LINK(lib_01, lib_02)
