/* Traced program: the parent waits while a child process it forked burns CPU in child_work,
 * then a grandchild started with exec (argv[0] child) burns CPU in exec_child_work. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

volatile unsigned long sink;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) void burn(double secs) {
  double end = now() + secs;
  while (now() < end)
    for (int i = 0; i < 10000; i++) sink += (unsigned long)i * i;
}
__attribute__((noinline)) void child_work(double secs) {
  burn(secs);
  sink++; /* not a tail call: keeps this frame */
}
__attribute__((noinline)) void exec_child_work(double secs) {
  burn(secs);
  sink++;
}

int main(int argc, char** argv) {
  if (argc > 2 && strcmp(argv[1], "child") == 0) {
    exec_child_work(atof(argv[2]));
    return 0;
  }
  double secs = argc > 1 ? atof(argv[1]) : 1.0;
  pid_t pid = fork();
  if (pid == 0) {
    child_work(secs);
    char arg[32];
    snprintf(arg, sizeof arg, "%f", secs);
    execl("/proc/self/exe", argv[0], "child", arg, (char*)NULL);
    _exit(127);
  }
  int status;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
