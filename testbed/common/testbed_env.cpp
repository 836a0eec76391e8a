#include "testbed/common/testbed_env.h"

#include "abi/gpu_timeline.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>

namespace testbed {

std::string testbed_dir() {
  const char* env = std::getenv("STRATA_TESTBED_DIR");
  std::string dir = (env && *env) ? env : "/tmp/strata-testbed";
  ::mkdir(dir.c_str(), 0777);  // EEXIST is the common case; a real failure shows at open()
  return dir;
}

std::string timeline_dir() {
  const char* env = std::getenv(STRATA_TIMELINE_DIR_ENV);
  std::string dir = (env && *env) ? env : STRATA_TIMELINE_DEFAULT_DIR;
  if (!(env && *env)) ::mkdir(dir.substr(0, dir.rfind('/')).c_str(), 0755);  // root's; EEXIST is common
  // As a real writer does (abi/gpu_timeline.h): sticky and open to all when it makes it.
  if (::mkdir(dir.c_str(), 0700) == 0) ::chmod(dir.c_str(), 01777);
  return dir;
}

unsigned configured_device_count() {
  const char* env = std::getenv("STRATA_TESTBED_GPUS");
  if (env && *env) {
    long n = std::strtol(env, nullptr, 10);
    if (n >= 1 && n <= static_cast<long>(STRATA_GPU_STATE_MAX_DEVICES)) return static_cast<unsigned>(n);
  }
  return 8;
}

static strata_gpu_state* map_gpu_state_once() {
  std::string path = testbed_dir() + "/gpu-state";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) return nullptr;
  // The lock serializes initialization between processes that start at the same time.
  ::flock(fd, LOCK_EX);
  struct stat st {};
  bool fresh = ::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < sizeof(strata_gpu_state);
  if (fresh && ::ftruncate(fd, sizeof(strata_gpu_state)) != 0) {
    ::close(fd);
    return nullptr;
  }
  void* p = ::mmap(nullptr, sizeof(strata_gpu_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    ::close(fd);
    return nullptr;
  }
  auto* state = static_cast<strata_gpu_state*>(p);
  if (state->magic != STRATA_GPU_STATE_MAGIC || state->version != STRATA_GPU_STATE_VERSION) {
    std::memset(state, 0, sizeof(*state));
    state->version = STRATA_GPU_STATE_VERSION;
    state->num_devices = configured_device_count();
    for (auto& d : state->dev) d.slowdown = 1.0f;
    __atomic_store_n(&state->magic, STRATA_GPU_STATE_MAGIC, __ATOMIC_RELEASE);
  }
  ::flock(fd, LOCK_UN);
  ::close(fd);  // the mapping stays valid
  return state;
}

strata_gpu_state* map_gpu_state() {
  static strata_gpu_state* state = map_gpu_state_once();
  return state;
}

uint64_t monotonic_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

void sleep_until_ns(uint64_t deadline_ns) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(deadline_ns / 1000000000ull);
  ts.tv_nsec = static_cast<long>(deadline_ns % 1000000000ull);
  while (::clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

}  // namespace testbed
