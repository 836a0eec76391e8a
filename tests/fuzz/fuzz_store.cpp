// A store file handed to `strata report` (or found on disk) may be corrupt or foreign: opening it
// read only must refuse with a reason or read it, never crash.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <unistd.h>

#include "store/store.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using strata::store::Store;
  // SQLite opens files by name and may look for a -journal/-wal beside them: a real temporary file.
  static const std::string path = [] {
    const char* tmp = std::getenv("TMPDIR");
    return std::string(tmp && *tmp ? tmp : "/tmp") + "/strata-fuzz-store-" + std::to_string(getpid()) + ".db";
  }();
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  auto st = Store::open_sqlite(path, Store::Mode::kReadOnly);
  if (st) {
    Store& s = **st;
    auto latest = s.latest_recording();
    (void)s.processes();
    (void)s.load_profile({});
    (void)s.collectives();
    (void)s.steps();
    (void)s.communicators();
    (void)s.device_activity();
    (void)s.thread_windows();
    (void)s.sample_hz(std::nullopt);
    if (latest && *latest) (void)s.stats(**latest);
  }
  std::remove(path.c_str());
  return 0;
}
