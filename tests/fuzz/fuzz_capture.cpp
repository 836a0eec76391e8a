// A capture file (strata record --save-events) given to the replay may be truncated, corrupt or
// foreign: reading it must refuse with a one-line reason or replay it, never crash.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>

#include "agent/capture.h"
#include "agent/engine.h"
#include "store/store.h"

namespace {
struct NullSink final : strata::agent::EventSink {
  void on_sample(const strata::agent::SampleEvent&) override {}
  void on_proc(const strata::agent::ProcEvent&) override {}
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata::agent;
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto c = parse_capture(bytes);
  if (!c) {
    if (c.error().message.empty() || c.error().message.find('\n') != std::string::npos) std::abort();
    return 0;
  }
  NullSink sink;
  for (const auto& r : c->records)
    if (r.kind == CaptureKind::kSamplerPoll) (void)decode_events(r.payload, sink);
  // The whole replay, into a throwaway store.
  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    return std::string(tmp && *tmp ? tmp : "/tmp") + "/strata-fuzz-capture-" + std::to_string(getpid());
  }();
  std::string cap = dir + ".cap", db = dir + ".db";
  std::ofstream(cap, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  std::remove(db.c_str());
  {
    auto store = strata::store::Store::open_sqlite(db, strata::store::Store::Mode::kCreateOrAppend);
    if (store) {
      std::ostringstream log;
      auto r = replay_capture(cap, **store, log);
      if (!r && (r.error().message.empty() || r.error().message.find('\n') != std::string::npos)) std::abort();
    }
  }
  std::remove(cap.c_str());
  std::remove(db.c_str());
  for (const char* suffix : {"-wal", "-shm", "-journal"}) std::remove((db + suffix).c_str());
  return 0;
}
