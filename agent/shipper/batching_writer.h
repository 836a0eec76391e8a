// The agent's Store when it ships to a collector: the writer calls the recorder pipeline makes are
// recorded as ingest.Batch records (proto/ingest.proto), sealed once per window (commit), compressed,
// queued in the on-disk spool and POSTed to `strata serve` by a background thread. Stacks are sent
// once per agent, then named by id. Reading is not supported: the data lives on the server.
#pragma once

#include <atomic>
#include <chrono>
#include <ostream>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "agent/shipper/spool.h"
#include "ingest.pb.h"
#include "store/store.h"
#include "symbolize/symbolizer.h"

namespace strata::agent::shipper {

struct ShipperOptions {
  std::string server;      // http://HOST:PORT
  std::string token;       // bearer token, empty for none
  std::string node;
  std::string agent_id;    // unique per agent run
  std::string spool_dir;
  uint64_t spool_max_bytes = 256ull << 20;
  double interval_s = 10;  // how often batches are sealed (the window): the server's silence clock
  size_t seal_bytes = 4u << 20;  // a batch is sealed early past this size (uncompressed)
};

// Row counts per record kind ("collectives", "stack_counts", ...).
using KindCounts = std::map<std::string, uint64_t>;

struct ShipperCounters {
  uint64_t batches_sealed = 0;
  uint64_t batches_sent = 0;      // acknowledged by the server (applied or already applied)
  uint64_t send_failures = 0;     // attempts that failed (unreachable, 5xx, 401, ...): retried
  uint64_t batches_rejected = 0;  // refused by the collector as invalid (its 400): quarantined
  std::map<int, uint64_t> kept_answers;  // attempts answered otherwise, by HTTP status (0: no
                                         // answer); the batch was kept for another try
  uint64_t batches_held = 0;      // spooled batches that failed at least once and wait to retry
  uint64_t batches_set_aside = 0; // held batches passed by newer ones (a newer one got through)
  uint64_t batches_dropped = 0;   // oldest dropped because the spool was full (or the new one)
  uint64_t bytes_sent = 0;        // compressed, acknowledged
  uint64_t spool_bytes = 0;
  uint64_t spool_batches = 0;
  KindCounts records_sealed;      // rows put into batches
  KindCounts records_acked;       // rows of acknowledged batches (this run's)
  KindCounts records_dropped;     // rows of batches the full spool dropped (this run's)
};

class BatchingWriter final : public store::Writer {
 public:
  using HealthFn = std::function<void(ingest::AgentHealth&)>;
  // Opens the spool (resending what a previous run left) and starts the shipping thread.
  static Result<std::unique_ptr<BatchingWriter>> open(const ShipperOptions& opts,
                                                      std::unique_ptr<symbolize::Symbolizer> symbolizer,
                                                      HealthFn health);
  ~BatchingWriter() override;

  // Seals what was written since the last seal into a batch, even when empty: an empty batch is
  // the agent's heartbeat.
  Status seal();
  // Waits up to timeout_s for the spool to drain; true when it did.
  bool drain(double timeout_s);
  ShipperCounters counters() const;
  // The shipping counters that /metrics shows beyond the spool's own (kept answers by status,
  // held and set-aside batches, quarantined), in Prometheus text.
  void write_metrics(std::ostream& o) const;

  // -- store::Writer (a shipping store is written only: reads go to the collector)
  Result<int64_t> begin_recording(const store::RecordingInfo& info) override;
  Status end_recording(int64_t recording, uint64_t ended_ns) override;
  Status put_process(int64_t recording, const store::ProcessInfo& p) override;
  Result<int64_t> intern_stack(const Stack& stack, store::UnwindMethod method) override;
  Status put_window(int64_t recording, uint64_t start_ns, uint64_t end_ns, store::CountKind kind,
                    const std::vector<store::StackCount>& counts, const store::WindowFidelity& fidelity = {}) override;
  Status put_stat(int64_t recording, const std::string& key, double value) override;
  Status put_metrics(int64_t recording, uint64_t start_ns, uint64_t end_ns,
                     const std::vector<store::Metric>& metrics) override;
  Status put_communicators(int64_t recording, const std::vector<store::CommunicatorRecord>& r) override;
  Status put_collectives(int64_t recording, const std::vector<store::CollectiveRecord>& r) override;
  Status put_device_activity(int64_t recording, const std::vector<store::DeviceActivity>& r) override;
  Status put_steps(int64_t recording, const std::vector<store::StepRecord>& r) override;
  Status put_launch_samples(int64_t recording, uint64_t start_ns, uint64_t end_ns,
                            const std::vector<store::LaunchSample>& r) override;
  // Frames are symbolized on the node when their stack is first interned.
  Result<std::vector<store::FrameRow>> unsymbolized_frames() override { return std::vector<store::FrameRow>{}; }
  Status update_frame_symbols(const std::vector<store::FrameRow>&) override { return {}; }
  Status begin() override { return {}; }
  Status commit() override { return seal(); }

 private:
  BatchingWriter(const ShipperOptions& opts, Spool spool, std::unique_ptr<symbolize::Symbolizer> symbolizer,
                 HealthFn health);
  ingest::Record& add(const char* kind, size_t rows);
  Status maybe_seal();
  void ship_loop();
  enum class Outcome { kDelivered, kQuarantine, kKeep };
  // One POST and what to do with the batch after it.
  Outcome ship_one(const Spool::Entry& e, const std::string& body);
  // Says (on stderr, at most once per kLogEvery) that batches are kept for an answer `status`.
  void log_kept(int status, const std::string& body, uint64_t seq);

  ShipperOptions opts_;
  Spool spool_;
  std::unique_ptr<symbolize::Symbolizer> symbolizer_;
  HealthFn health_;

  // Writer state (the caller's thread).
  ingest::Batch batch_;
  size_t batch_bytes_ = 0;
  KindCounts batch_counts_;
  uint64_t next_batch_id_ = 1;
  int64_t next_recording_ = 1;
  int64_t next_stack_ = 1;
  std::unordered_map<std::string, int64_t> stack_ids_;  // stack content -> local id, sent already

  // Shared with the shipping thread.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  ShipperCounters counters_;
  std::map<uint64_t, KindCounts> pending_counts_;  // spool seq -> rows, for records_acked
  std::atomic<bool> spool_dropped_{false};          // the dictionary must be sent again
  std::chrono::steady_clock::time_point last_log_{};  // the shipping thread's last "kept" line
  uint64_t unlogged_ = 0;                             // kept answers since that line
  std::thread thread_;
};

}  // namespace strata::agent::shipper
