#include "agent/engine.h"

#include <ostream>

#include "agent/pipeline.h"

namespace strata::agent {

namespace {
enum class EventTag : uint8_t { kSample = 1, kFork = 2, kExec = 3, kExit = 4 };
}  // namespace

void encode_sample(ByteWriter& w, const SampleEvent& e) {
  w.u8(static_cast<uint8_t>(EventTag::kSample));
  w.u32(e.pid);
  w.u32(e.tid);
  w.u32(e.cpu);
  w.u64(e.ts_ns);
  w.str(e.comm);
  w.u32(static_cast<uint32_t>(e.kstack.size()));
  for (uint64_t a : e.kstack) w.u64(a);
  w.u32(static_cast<uint32_t>(e.ustack.size()));
  for (const auto& f : e.ustack) {
    w.u8(f.has_build_id ? 1 : 0);
    w.str(std::string_view(reinterpret_cast<const char*>(f.build_id.data()), f.build_id.size()));
    w.u64(f.offset_or_ip);
  }
  w.u8(e.has_regs ? 1 : 0);
  w.u64(e.ip);
  w.u64(e.sp);
  w.u64(e.bp);
  w.u64(e.stack_base);
  w.str(std::string_view(reinterpret_cast<const char*>(e.stack.data()), e.stack.size()));
  w.u32(static_cast<uint32_t>(e.pystack.size()));
  for (const auto& f : e.pystack) {
    w.u64(f.code);
    w.u32(f.lasti);
    w.u32(f.flags);
  }
  w.u8(e.kernel_cfi ? 1 : 0);
  w.u8(e.kcfi_stop);
  w.u32(e.kcfi_frames);
  w.u32(e.kcfi_fp_frames);
}

void encode_proc(ByteWriter& w, const ProcEvent& e) {
  w.u8(static_cast<uint8_t>(e.type == ProcEvent::Type::kFork   ? EventTag::kFork
                            : e.type == ProcEvent::Type::kExec ? EventTag::kExec
                                                               : EventTag::kExit));
  w.u32(e.pid);
  w.u32(e.ppid);
  w.u64(e.ts_ns);
  w.str(e.comm);
}

bool decode_events(std::string_view payload, EventSink& sink) {
  ByteReader r(payload);
  SampleEvent s;
  while (r.ok() && r.left() > 0) {
    auto tag = static_cast<EventTag>(r.u8());
    if (tag == EventTag::kSample) {
      s.pid = r.u32();
      s.tid = r.u32();
      s.cpu = r.u32();
      s.ts_ns = r.u64();
      s.comm = r.str();
      uint32_t n = r.u32();
      if (n > r.left() / 8) return false;  // a count is checked against what is left, never trusted
      s.kstack.resize(n);
      for (auto& a : s.kstack) a = r.u64();
      n = r.u32();
      if (n > r.left() / 32) return false;
      s.ustack.resize(n);
      for (auto& f : s.ustack) {
        f.has_build_id = r.u8() != 0;
        std::string id = r.str();
        if (id.size() != f.build_id.size()) return false;
        std::memcpy(f.build_id.data(), id.data(), id.size());
        f.offset_or_ip = r.u64();
      }
      s.has_regs = r.u8() != 0;
      s.ip = r.u64();
      s.sp = r.u64();
      s.bp = r.u64();
      s.stack_base = r.u64();
      std::string stack = r.str();
      s.stack.assign(stack.begin(), stack.end());
      n = r.u32();
      if (n > r.left() / 16) return false;
      s.pystack.resize(n);
      for (auto& f : s.pystack) {
        f.code = r.u64();
        f.lasti = r.u32();
        f.flags = r.u32();
      }
      s.kernel_cfi = r.u8() != 0;
      s.kcfi_stop = r.u8();
      s.kcfi_frames = static_cast<uint16_t>(r.u32());
      s.kcfi_fp_frames = static_cast<uint16_t>(r.u32());
      if (!r.ok()) return false;
      sink.on_sample(s);
    } else if (tag == EventTag::kFork || tag == EventTag::kExec || tag == EventTag::kExit) {
      ProcEvent e;
      e.type = tag == EventTag::kFork ? ProcEvent::Type::kFork
               : tag == EventTag::kExec ? ProcEvent::Type::kExec
                                        : ProcEvent::Type::kExit;
      e.pid = r.u32();
      e.ppid = r.u32();
      e.ts_ns = r.u64();
      e.comm = r.str();
      if (!r.ok()) return false;
      sink.on_proc(e);
    } else {
      return false;
    }
  }
  return r.ok();
}

namespace {

// Passes each event on and keeps its encoding for the drain's record.
class RecordingSink final : public EventSink {
 public:
  explicit RecordingSink(EventSink& next) : next_(next) {}
  void on_sample(const SampleEvent& e) override {
    encode_sample(w_, e);
    next_.on_sample(e);
  }
  void on_proc(const ProcEvent& e) override {
    encode_proc(w_, e);
    next_.on_proc(e);
  }
  const std::string& data() const { return w_.data(); }

 private:
  EventSink& next_;
  ByteWriter w_;
};

class CapturingSampler final : public OnCpuSampler {
 public:
  CapturingSampler(std::unique_ptr<OnCpuSampler> live, Tape& tape) : live_(std::move(live)), tape_(tape) {}
  Status add_target(uint32_t pid) override { return live_->add_target(pid); }
  Result<int> poll(int timeout_ms, EventSink& sink) override {
    RecordingSink rec(sink);
    auto n = live_->poll(timeout_ms, rec);
    tape_.put(CaptureKind::kSamplerPoll, rec.data());  // every drain, empty ones too: replay polls as often
    return n;
  }
  Status add_wake_fd(int fd) override { return live_->add_wake_fd(fd); }
  SamplerCounters counters() const override { return live_->counters(); }
  Status set_frequency(unsigned hz) override { return live_->set_frequency(hz); }
  int targets_map_fd() const override { return live_->targets_map_fd(); }
  int target_bits_fd() const override { return live_->target_bits_fd(); }
  Status set_python_process(uint32_t pid, const strata_py_offsets* o) override {
    return live_->set_python_process(pid, o);
  }
  uint32_t user_stack_mode() const override { return live_->user_stack_mode(); }
  Result<uint32_t> load_unwind_module(const strata_unwind_row* rows, size_t n) override {
    return live_->load_unwind_module(rows, n);
  }
  Status set_process_mappings(uint32_t pid, const strata_proc_mappings* maps) override {
    return live_->set_process_mappings(pid, maps);
  }

 private:
  std::unique_ptr<OnCpuSampler> live_;
  Tape& tape_;
};

// Counts what a replay delivered, for the closing stats (the kernel's own counters are the live
// run's and are not taped).
class ReplaySampler final : public OnCpuSampler {
 public:
  explicit ReplaySampler(Tape& tape) : tape_(tape) {}
  Status add_target(uint32_t) override { return {}; }
  Result<int> poll(int, EventSink& sink) override {
    auto rec = tape_.next(CaptureKind::kSamplerPoll);
    if (!rec) return 0;
    CountingSink counting(sink, counters_);
    if (!decode_events(*rec, counting)) tape_.fail("corrupt sampler record");
    return static_cast<int>(counting.n);
  }
  Status add_wake_fd(int) override { return {}; }
  SamplerCounters counters() const override { return counters_; }
  Status set_frequency(unsigned) override { return {}; }
  int targets_map_fd() const override { return -1; }
  int target_bits_fd() const override { return -1; }
  Status set_python_process(uint32_t, const strata_py_offsets*) override { return {}; }
  uint32_t user_stack_mode() const override { return 0; }

 private:
  struct CountingSink final : EventSink {
    CountingSink(EventSink& next, SamplerCounters& c) : next(next), c(c) {}
    void on_sample(const SampleEvent& e) override {
      ++n;
      ++c.samples;
      ++c.emitted;
      next.on_sample(e);
    }
    void on_proc(const ProcEvent& e) override {
      ++n;
      ++c.proc_events;
      next.on_proc(e);
    }
    EventSink& next;
    SamplerCounters& c;
    uint64_t n = 0;
  };
  Tape& tape_;
  SamplerCounters counters_;
};

}  // namespace

std::unique_ptr<OnCpuSampler> capturing_sampler(std::unique_ptr<OnCpuSampler> live, Tape& tape) {
  return std::make_unique<CapturingSampler>(std::move(live), tape);
}

std::unique_ptr<OnCpuSampler> replay_sampler(Tape& tape) { return std::make_unique<ReplaySampler>(tape); }

Result<ReplaySummary> replay_capture(const std::string& path, store::Writer& sink, std::ostream& log,
                                     const ReplayOptions& options) {
  auto capture = read_capture(path);
  if (!capture) return capture.error();
  Tape tape(std::move(*capture));
  const auto& h = tape.header();
  PipelineOptions o;
  o.node = h.node;
  o.frequency_hz = h.frequency_hz;
  o.window_s = h.window_s;
  o.layers = h.layers;
  o.raw_device_records = h.raw_device_records;
  if (h.unwind_table_bytes) o.unwind_table_bytes = h.unwind_table_bytes;
  o.budget_share = 0;     // the agent's own cost is not taped: the budget never acts in replay
  o.symbolize = false;    // frames stay build id + offset: symbols would be this machine's files
  o.tape = &tape;
  o.flight_recorder = options.flight_recorder;
  o.log_prefix = "strata: replay: ";
  NodePipeline pipeline(o, log);
  if (auto st = pipeline.start(); !st) return st.error();
  ReplaySummary summary;
  auto broken = [&](const std::string& where) {
    return Error{"replay of " + path + " " + where + ": " + tape.error().value_or("corrupt control record")};
  };
  bool begun = false, finished = false;
  while (!finished) {
    auto rec = tape.next(CaptureKind::kControl);
    if (!rec) return broken(begun ? "stopped before the run's end" : "has no run");
    ByteReader r(*rec);
    auto op = static_cast<CaptureControl>(r.u8());
    if (!begun && op != CaptureControl::kBegin) return broken("does not begin with the run");
    switch (op) {
      case CaptureControl::kBegin: {
        std::string command = r.str();
        if (!r.at_end() || begun) return broken("at its start");
        if (auto st = pipeline.begin(sink, command); !st) return st.error();
        begun = true;
        break;
      }
      case CaptureControl::kWatch: {
        uint32_t pid = r.u32();
        bool pre = r.u8() != 0;
        if (!r.at_end()) return broken("at a watch");
        if (auto st = pipeline.watch(pid, pre); !st) return st.error();
        break;
      }
      case CaptureControl::kAddTarget: {
        uint32_t pid = r.u32();
        if (!r.at_end()) return broken("at a target");
        if (auto st = pipeline.add_target(pid); !st) return st.error();
        break;
      }
      case CaptureControl::kAnnounce: {
        uint32_t pid = r.u32(), ppid = r.u32();
        std::string comm = r.str();
        bool pre = r.u8() != 0;
        if (!r.at_end()) return broken("at a process");
        pipeline.announce(pid, ppid, comm, pre);
        break;
      }
      case CaptureControl::kReapedCpu: {
        uint64_t ns = r.u64();
        if (!r.at_end()) return broken("at a reaped child");
        pipeline.note_reaped_cpu_ns(ns);
        break;
      }
      case CaptureControl::kForgetGone:
        if (!r.at_end()) return broken("at a forget");
        pipeline.forget_gone_pids();
        break;
      case CaptureControl::kStep: {
        int32_t timeout = static_cast<int32_t>(r.u32());
        if (!r.at_end()) return broken("at a step");
        if (auto st = pipeline.step(timeout); !st) return st.error();
        ++summary.steps;
        break;
      }
      case CaptureControl::kFinish: {
        if (!r.at_end()) return broken("at its end");
        auto t = pipeline.finish();
        if (!t) return t.error();
        summary.windows = t->windows;
        summary.samples = t->samples_stored;
        finished = true;
        break;
      }
      default:
        return broken("at an unknown control record");
    }
    if (tape.error()) return broken("mid-run");
  }
  return summary;
}

}  // namespace strata::agent
