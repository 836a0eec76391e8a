/* Traced program: spins in read(/dev/zero) from read_loop, so samples land in the kernel under
 * user frames. Runs for argv[1] seconds (default 2). */
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static char buf[1 << 20];

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) void read_loop(int fd, double end) {
  while (now() < end) {
    if (read(fd, buf, sizeof buf) < 0) exit(1);
  }
}

int main(int argc, char** argv) {
  double secs = argc > 1 ? atof(argv[1]) : 2.0;
  int fd = open("/dev/zero", O_RDONLY);
  if (fd < 0) return 1;
  read_loop(fd, now() + secs);
  return 0;
}
