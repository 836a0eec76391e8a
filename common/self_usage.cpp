#include "common/self_usage.h"

#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

namespace strata {

double self_cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

double thread_cpu_seconds() {
  timespec ts{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

uint64_t self_rss_bytes() {
  std::ifstream f("/proc/self/statm");
  uint64_t size = 0, rss = 0;
  if (!(f >> size >> rss)) return 0;
  long page = sysconf(_SC_PAGESIZE);
  return rss * static_cast<uint64_t>(page > 0 ? page : 4096);
}

bool token_matches(const std::string& presented, const std::string& expected) {
  size_t n = std::max(presented.size(), expected.size());
  unsigned char diff = presented.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    unsigned char a = i < presented.size() ? static_cast<unsigned char>(presented[i]) : 0;
    unsigned char b = i < expected.size() ? static_cast<unsigned char>(expected[i]) : 0;
    diff |= a ^ b;
  }
  return diff == 0;
}

bool bearer_authorized(const std::string& authorization_header, const std::string& token) {
  if (token.empty()) return true;
  static const std::string kPrefix = "Bearer ";
  if (authorization_header.size() <= kPrefix.size() || authorization_header.compare(0, kPrefix.size(), kPrefix) != 0)
    return false;
  return token_matches(authorization_header.substr(kPrefix.size()), token);
}

}  // namespace strata
