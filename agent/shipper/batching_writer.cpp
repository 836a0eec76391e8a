#include "agent/shipper/batching_writer.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <optional>
#include <set>

#include "proto/ingest_codec.h"
#include "server/prometheus.h"
#include "store/catalog.h"

namespace strata::agent::shipper {
namespace {

// One whole line on stderr: the writers of a process (an agent has one, tests several) share it,
// and a line written piece by piece interleaves with another thread's.
void say(const std::string& line) {
  static std::mutex mu;
  std::lock_guard lock(mu);
  std::cerr << line << std::flush;
}

// A local stack dictionary larger than this starts over (the server re-interns what is sent
// again): the agent's memory stays bounded on long runs with ever-new stacks.
constexpr size_t kMaxStacks = 200'000;
// Vectors are split into records of at most this many rows, so a batch can be sealed between them.
constexpr size_t kRowsPerRecord = 20'000;

// Retrying a batch that was kept: after 0.5 s, doubling up to 30 s (a collector restart is
// seconds; a long outage costs one attempt per batch per 30 s at most).
constexpr double kRetryFirstS = 0.5;
constexpr double kRetryMaxS = 30;
// After any failed attempt the next one, whatever batch, waits too (doubling up to 10 s): an
// unreachable collector is not asked in a tight loop.
constexpr double kPauseFirstS = 0.5;
constexpr double kPauseMaxS = 10;
// Batches go in order (a batch may name stacks an earlier one defined). After this many failed
// attempts of the oldest, the next one is tried once: if it gets through, the collector is fine
// and the oldest is set aside (retried on its own schedule) so it cannot hold back the newer ones.
constexpr uint32_t kProbeAfterFailures = 3;
// How often a collector that keeps refusing is said in the log.
constexpr auto kLogEvery = std::chrono::seconds(60);
// Waiting with nothing to send: a seal wakes the thread sooner.
constexpr double kIdleWaitS = 1.0;

// An answer's body for a log line: its start, on one line.
std::string one_line(const std::string& body) {
  std::string s = body.substr(0, 200);
  for (char& c : s) if (c == '\n' || c == '\r') c = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

// The collector's answer to a batch it finds invalid (server.cpp, ingest): 400 with its JSON
// error. A 400 from something else on the way (a proxy's page) is not the collector's verdict.
bool collector_says_invalid(const httplib::Result& res) {
  return res->status == 400 && res->body.rfind("{\"error\":", 0) == 0;
}

void to_proto(const Frame& f, ingest::Frame* p) {
  p->set_kind(static_cast<uint32_t>(f.kind));
  p->set_build_id(f.build_id);
  p->set_module(f.module);
  p->set_offset(f.offset);
  p->set_function(f.function);
  p->set_file(f.file);
  p->set_line(f.line);
}

std::string stack_key(const Stack& stack, store::UnwindMethod method) {
  std::string k(1, static_cast<char>(method));
  for (const auto& f : stack) {
    k += static_cast<char>(f.kind);
    k.append(reinterpret_cast<const char*>(&f.offset), sizeof f.offset);
    k += f.build_id;
    k += '\0';
    k += f.module;
    k += '\0';
    if (f.kind == FrameKind::kPython || f.kind == FrameKind::kCuda) {
      k += f.function;
      k += '\0';
      k += f.file;
      k += '\0';
    }
  }
  return k;
}

// Splits `rows` into records of kRowsPerRecord, each made by `emit(first, last)`.
template <typename Rows, typename Emit>
Status chunked(const Rows& rows, Emit emit) {
  for (size_t i = 0; i < rows.size(); i += kRowsPerRecord) {
    size_t end = std::min(rows.size(), i + kRowsPerRecord);
    if (auto st = emit(i, end); !st) return st;
  }
  return {};
}

}  // namespace

Result<std::unique_ptr<BatchingWriter>> BatchingWriter::open(const ShipperOptions& opts,
                                                             std::unique_ptr<symbolize::Symbolizer> symbolizer,
                                                             HealthFn health) {
  if (opts.server.rfind("http://", 0) != 0)
    return Error{"--server " + opts.server + ": expected http://HOST:PORT (https: put a TLS proxy in front)"};
  auto spool = Spool::open(opts.spool_dir, opts.spool_max_bytes);
  if (!spool) return spool.error();
  return std::unique_ptr<BatchingWriter>(
      new BatchingWriter(opts, std::move(*spool), std::move(symbolizer), std::move(health)));
}

BatchingWriter::BatchingWriter(const ShipperOptions& opts, Spool spool,
                               std::unique_ptr<symbolize::Symbolizer> symbolizer, HealthFn health)
    : opts_(opts), spool_(std::move(spool)), symbolizer_(std::move(symbolizer)), health_(std::move(health)) {
  thread_ = std::thread([this] { ship_loop(); });
}

BatchingWriter::~BatchingWriter() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

ingest::Record& BatchingWriter::add(const char* kind, size_t rows) {
  batch_counts_[kind] += rows;
  return *batch_.add_records();
}

Status BatchingWriter::maybe_seal() {
  // ByteSizeLong walks the batch: only check now and then, it is a bound, not a budget.
  if (batch_.records_size() % 16 != 0) return {};
  if (batch_.ByteSizeLong() < opts_.seal_bytes) return {};
  return seal();
}

Result<int64_t> BatchingWriter::begin_recording(const store::RecordingInfo& info) {
  int64_t id = next_recording_++;
  auto* r = add("recordings", 1).mutable_recording();
  r->set_local_id(id);
  r->set_node(info.node);
  r->set_command(info.command);
  r->set_started_ns(info.started_ns);
  r->set_sample_hz(info.sample_hz);
  r->set_window_s(info.window_s);
  return id;
}

Status BatchingWriter::end_recording(int64_t recording, uint64_t ended_ns) {
  auto* r = add("recording_ends", 1).mutable_recording_end();
  r->set_recording(recording);
  r->set_ended_ns(ended_ns);
  return {};
}

Status BatchingWriter::put_process(int64_t recording, const store::ProcessInfo& p) {
  auto* r = add("processes", 1).mutable_process();
  r->set_recording(recording);
  r->set_pid(p.pid);
  r->set_ppid(p.ppid);
  r->set_start_ns(p.start_ns);
  r->set_node(p.node);
  r->set_comm(p.comm);
  r->set_command(p.command);
  r->set_job(p.job);
  r->set_rank(p.rank);
  r->set_local_rank(p.local_rank);
  r->set_world_size(p.world_size);
  r->set_pod_uid(p.pod_uid);
  r->set_container_id(p.container_id);
  r->set_pod_name(p.pod_name);
  r->set_pod_namespace(p.pod_namespace);
  return maybe_seal();
}

Result<int64_t> BatchingWriter::intern_stack(const Stack& stack, store::UnwindMethod method) {
  if (spool_dropped_.exchange(false)) stack_ids_.clear();  // definitions may have been in dropped batches
  std::string key = stack_key(stack, method);
  if (auto it = stack_ids_.find(key); it != stack_ids_.end()) return it->second;
  if (stack_ids_.size() >= kMaxStacks) stack_ids_.clear();
  int64_t id = next_stack_++;
  Stack frames = stack;
  if (symbolizer_) {
    bool unresolved = false;
    for (const auto& f : frames)
      unresolved |= f.function.empty() && (f.kind == FrameKind::kNative || f.kind == FrameKind::kKernel);
    if (unresolved) symbolizer_->symbolize(frames);
  }
  auto* d = add("stacks", 1).mutable_stack();
  d->set_local_id(id);
  d->set_method(static_cast<uint32_t>(method));
  for (const auto& f : frames) to_proto(f, d->add_frames());
  stack_ids_.emplace(std::move(key), id);
  return id;
}

Status BatchingWriter::put_window(int64_t recording, uint64_t start_ns, uint64_t end_ns, store::CountKind kind,
                                  const std::vector<store::StackCount>& counts,
                                  const store::WindowFidelity& fidelity) {
  return chunked(counts, [&](size_t a, size_t b) {
    auto* w = add("stack_counts", b - a).mutable_window();
    w->set_recording(recording);
    w->set_start_ns(start_ns);
    w->set_end_ns(end_ns);
    w->set_kind(static_cast<uint32_t>(kind));
    w->set_sample_hz(fidelity.sample_hz);
    w->set_unwinding(fidelity.unwinding);
    for (size_t i = a; i < b; ++i) {
      const auto& c = counts[i];
      auto* p = w->add_counts();
      p->set_pid(c.pid);
      p->set_tid(c.tid);
      p->set_thread_comm(c.thread_comm);
      p->set_stack(c.stack_id);
      p->set_value(c.value);
    }
    return maybe_seal();
  });
}

Status BatchingWriter::put_stat(int64_t recording, const std::string& key, double value) {
  auto* s = add("stats", 1).mutable_stat();
  s->set_recording(recording);
  s->set_key(key);
  s->set_value(value);
  return {};
}

Status BatchingWriter::put_metrics(int64_t recording, uint64_t start_ns, uint64_t end_ns,
                                   const std::vector<store::Metric>& metrics) {
  return chunked(metrics, [&](size_t a, size_t b) {
    auto* m = add("metrics", b - a).mutable_metrics();
    m->set_recording(recording);
    m->set_start_ns(start_ns);
    m->set_end_ns(end_ns);
    for (size_t i = a; i < b; ++i) store::catalog::to_message(store::catalog::kMetrics, metrics[i], *m->add_metrics());
    return maybe_seal();
  });
}

Status BatchingWriter::put_communicators(int64_t recording, const std::vector<store::CommunicatorRecord>& rows) {
  return chunked(rows, [&](size_t a, size_t b) {
    auto* m = add("communicators", b - a).mutable_communicators();
    m->set_recording(recording);
    for (size_t i = a; i < b; ++i) store::catalog::to_message(store::catalog::kCommunicators, rows[i], *m->add_rows());
    return maybe_seal();
  });
}

Status BatchingWriter::put_collectives(int64_t recording, const std::vector<store::CollectiveRecord>& rows) {
  return chunked(rows, [&](size_t a, size_t b) {
    auto* m = add("collectives", b - a).mutable_collectives();
    m->set_recording(recording);
    for (size_t i = a; i < b; ++i) store::catalog::to_message(store::catalog::kCollectives, rows[i], *m->add_rows());
    return maybe_seal();
  });
}

Status BatchingWriter::put_device_activity(int64_t recording, const std::vector<store::DeviceActivity>& rows) {
  return chunked(rows, [&](size_t a, size_t b) {
    auto* m = add("device_activity", b - a).mutable_device_activity();
    m->set_recording(recording);
    for (size_t i = a; i < b; ++i) store::catalog::to_message(store::catalog::kDeviceActivity, rows[i], *m->add_rows());
    return maybe_seal();
  });
}

Status BatchingWriter::put_steps(int64_t recording, const std::vector<store::StepRecord>& rows) {
  return chunked(rows, [&](size_t a, size_t b) {
    auto* m = add("steps", b - a).mutable_steps();
    m->set_recording(recording);
    for (size_t i = a; i < b; ++i) {
      store::catalog::to_message(store::catalog::kSteps, rows[i], *m->add_rows());
    }
    return maybe_seal();
  });
}

Status BatchingWriter::put_launch_samples(int64_t recording, uint64_t start_ns, uint64_t end_ns,
                                          const std::vector<store::LaunchSample>& rows) {
  return chunked(rows, [&](size_t a, size_t b) {
    auto* m = add("launch_samples", b - a).mutable_launch_samples();
    m->set_recording(recording);
    m->set_start_ns(start_ns);
    m->set_end_ns(end_ns);
    for (size_t i = a; i < b; ++i) store::catalog::to_message(store::catalog::kLaunchSamples, rows[i], *m->add_rows());
    return maybe_seal();
  });
}

Status BatchingWriter::seal() {
  batch_.set_schema_version(ingest::kIngestVersion);
  batch_.set_agent_id(opts_.agent_id);
  batch_.set_node(opts_.node);
  batch_.set_batch_id(next_batch_id_++);
  auto* h = batch_.mutable_health();
  if (health_) health_(*h);
  h->set_interval_s(opts_.interval_s);
  h->set_spool_bytes(spool_.bytes());
  h->set_spool_dropped_batches(spool_.dropped());
  auto bytes = ingest::encode_batch(batch_);
  batch_.Clear();
  KindCounts counts;
  counts.swap(batch_counts_);
  if (!bytes) return bytes.error();
  std::vector<uint64_t> dropped;
  auto seq = spool_.push(*bytes, dropped);
  if (!seq) return seq.error();
  {
    std::lock_guard lock(mu_);
    counters_.batches_sealed++;
    for (const auto& [k, v] : counts) counters_.records_sealed[k] += v;
    auto count_dropped = [&](const KindCounts& rows) {
      for (const auto& [k, v] : rows) counters_.records_dropped[k] += v;
    };
    for (uint64_t d : dropped) {
      if (auto it = pending_counts_.find(d); it != pending_counts_.end()) {
        count_dropped(it->second);
        pending_counts_.erase(it);
      }
    }
    counters_.batches_dropped = spool_.dropped();
    if (*seq != 0) pending_counts_[*seq] = std::move(counts);
    else count_dropped(counts);
  }
  if (!dropped.empty() || *seq == 0) spool_dropped_ = true;
  cv_.notify_all();
  return {};
}

bool BatchingWriter::drain(double timeout_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  cv_.notify_all();
  while (std::chrono::steady_clock::now() < deadline) {
    if (spool_.count() == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return spool_.count() == 0;
}

void BatchingWriter::write_metrics(std::ostream& o) const {
  auto c = counters();
  server::prom::family(o, "strata_agent_batch_answers_kept_total", "counter",
                       "Send attempts whose answer kept the batch in the spool, by HTTP status (0: no answer).");
  for (const auto& [status, n] : c.kept_answers)
    o << "strata_agent_batch_answers_kept_total{status=\"" << status << "\"} " << n << "\n";
  server::prom::family(o, "strata_agent_batches_held", "gauge", "Spooled batches that failed to send and wait to retry.");
  o << "strata_agent_batches_held " << c.batches_held << "\n";
  server::prom::family(o, "strata_agent_batches_set_aside", "gauge",
                       "Held batches that newer ones passed (a newer one got through).");
  o << "strata_agent_batches_set_aside " << c.batches_set_aside << "\n";
  server::prom::family(o, "strata_agent_batches_quarantined_total", "counter",
                       "Batches the collector refused as invalid, moved to " + spool_.quarantine_dir() + ".");
  o << "strata_agent_batches_quarantined_total " << spool_.quarantined() << "\n";
}

ShipperCounters BatchingWriter::counters() const {
  std::lock_guard lock(mu_);
  ShipperCounters c = counters_;
  c.spool_bytes = spool_.bytes();
  c.spool_batches = spool_.count();
  c.batches_dropped = spool_.dropped();
  return c;
}

BatchingWriter::Outcome BatchingWriter::ship_one(const Spool::Entry& e, const std::string& body) {
  httplib::Client cli(opts_.server);
  cli.set_connection_timeout(2, 0);
  cli.set_read_timeout(30, 0);
  cli.set_write_timeout(30, 0);
  httplib::Headers headers;
  if (!opts_.token.empty()) headers.emplace("Authorization", "Bearer " + opts_.token);
  auto res = cli.Post("/api/v1/ingest", headers, body, "application/x-strata-batch+zstd");
  int status = res ? res->status : 0;
  if (status >= 200 && status < 300) {
    std::lock_guard lock(mu_);
    counters_.batches_sent++;
    counters_.bytes_sent += e.bytes;
    if (auto it = pending_counts_.find(e.seq); it != pending_counts_.end()) {
      for (const auto& [k, v] : it->second) counters_.records_acked[k] += v;
      pending_counts_.erase(it);
    }
    return Outcome::kDelivered;
  }
  if (res && collector_says_invalid(res)) {
    // Resending would never help: out of the spool, into quarantine, counted and said.
    {
      std::lock_guard lock(mu_);
      counters_.batches_rejected++;
      pending_counts_.erase(e.seq);
    }
    say("strata: agent: the collector refused batch " + std::to_string(e.seq) + " as invalid (HTTP 400): " +
        one_line(res->body) + "; moved to " + spool_.quarantine_dir() + "\n");
    return Outcome::kQuarantine;
  }
  // Anything else keeps the batch: no answer, 5xx, throttling, a token being rotated (401/403),
  // a proxy in front (404, 413, its own 400 page), or an answer nobody expected.
  {
    std::lock_guard lock(mu_);
    counters_.send_failures++;
    counters_.kept_answers[status]++;
  }
  log_kept(status, res ? res->body : std::string(), e.seq);
  return Outcome::kKeep;
}

void BatchingWriter::log_kept(int status, const std::string& body, uint64_t seq) {
  auto now = std::chrono::steady_clock::now();
  ++unlogged_;
  if (last_log_ != std::chrono::steady_clock::time_point{} && now - last_log_ < kLogEvery) return;
  std::string answer = status == 0 ? std::string("no answer (unreachable or timed out)") : "HTTP " + std::to_string(status);
  std::string said = one_line(body);
  say("strata: agent: the collector at " + opts_.server + " gave " + answer + " for batch " + std::to_string(seq) +
      (said.empty() ? "" : ": " + said) + "; batches stay in the spool and are retried (" + std::to_string(unlogged_) +
      " such answers since the last line, at most one line a minute)\n");
  last_log_ = now;
  unlogged_ = 0;
}

void BatchingWriter::ship_loop() {
  using Clock = std::chrono::steady_clock;
  struct Retry {
    uint32_t failures = 0;
    Clock::time_point not_before{};
  };
  std::map<uint64_t, Retry> retry;  // spooled batches that failed, by seq
  std::set<uint64_t> aside;         // ... passed by a newer one that got through
  bool probe = false;               // the oldest failed kProbeAfterFailures more times: try the next
  double backoff_s = 0;  // after failed attempts in a row: doubling, 0 after a success
  double wait_s = 0;     // before the next look at the spool; 0: as soon as there is a batch
  bool until_due = false;  // waiting only for held batches to be due: a new batch ends the wait
  auto seconds = [](double s) { return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)); };
  while (true) {
    {
      std::unique_lock lock(mu_);
      auto wait = std::chrono::duration<double>(wait_s > 0 ? wait_s : kIdleWaitS);
      uint64_t spooled = spool_.count();
      cv_.wait_for(lock, wait, [&] {
        return stop_ || (wait_s == 0 && spool_.count() > 0) || (until_due && spool_.count() > spooled);
      });
      if (stop_) return;
      counters_.batches_held = retry.size();
      counters_.batches_set_aside = aside.size();
    }
    wait_s = 0;
    until_due = false;
    while (true) {
      // Forget batches the spool no longer has (dropped when full).
      auto entries = spool_.entries();
      std::set<uint64_t> present;
      for (const auto& e : entries) present.insert(e.seq);
      std::erase_if(retry, [&](const auto& kv) { return !present.count(kv.first); });
      std::erase_if(aside, [&](uint64_t seq) { return !present.count(seq); });
      {
        std::lock_guard lock(mu_);
        counters_.batches_held = retry.size();
        counters_.batches_set_aside = aside.size();
      }
      if (entries.empty()) break;
      auto now = Clock::now();
      auto due = [&](uint64_t seq) {
        auto it = retry.find(seq);
        return it == retry.end() || it->second.not_before <= now;
      };
      // What to send: a set-aside batch whose wait is over, else (probing) the one after the
      // oldest, else the oldest of the others when due.
      std::optional<uint64_t> pick, head, next;
      for (const auto& e : entries) {
        if (aside.count(e.seq)) {
          if (!pick && due(e.seq)) pick = e.seq;
        } else if (!head) {
          head = e.seq;
        } else if (!next) {
          next = e.seq;
        }
      }
      bool probing = false;
      if (!pick && probe && next && due(*next)) {
        pick = next;
        probing = true;
      }
      if (!pick && head && due(*head)) pick = head;
      if (!pick) {
        // Nothing due: sleep until the first one is (a seal does not wake us: older ones wait).
        auto first = Clock::time_point::max();
        for (const auto& [seq, r] : retry) first = std::min(first, r.not_before);
        wait_s = first == Clock::time_point::max()
                      ? kIdleWaitS
                      : std::clamp(std::chrono::duration<double>(first - now).count(), 0.05, kRetryMaxS);
        until_due = true;
        break;
      }
      auto e = spool_.checkout(*pick);
      if (!e) continue;  // dropped meanwhile
      auto body = spool_.read(*e);
      Outcome out = body ? ship_one(*e, *body) : Outcome::kQuarantine;  // unreadable: never sendable
      if (probing) probe = false;
      if (out == Outcome::kKeep) {
        spool_.release();
        auto& r = retry[e->seq];
        r.failures++;
        r.not_before = Clock::now() + seconds(std::min(kRetryMaxS, kRetryFirstS * std::pow(2.0, std::min<uint32_t>(r.failures - 1, 16))));
        if (head && e->seq == *head && r.failures % kProbeAfterFailures == 0) probe = true;
        backoff_s = std::min(kPauseMaxS, backoff_s == 0 ? kPauseFirstS : backoff_s * 2);
        wait_s = backoff_s;
        break;
      }
      if (out == Outcome::kQuarantine) {
        if (auto moved = spool_.quarantine(*e); !moved)
          say("strata: agent: " + moved.error().message + " (the batch left the spool)\n");
      } else {
        spool_.remove(*e);
      }
      retry.erase(e->seq);
      aside.erase(e->seq);
      backoff_s = 0;
      if (probing && head) {
        // The next batch got through where the oldest did not: that one is set aside, and the
        // batches after it go on. They may name stacks it defined: the writer sends its stack
        // dictionary again from the next batch on.
        aside.insert(*head);
        spool_dropped_ = true;
      }
      std::lock_guard lock(mu_);
      if (stop_) return;
    }
  }
}

}  // namespace strata::agent::shipper
