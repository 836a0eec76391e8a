#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <map>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "profile.pb.h"
#include "report/exporters.h"

namespace strata::report {

namespace {

namespace pb = perftools::profiles;

// Builds the tables of a pprof Profile: every string, mapping, function and location once, each
// referred to by index or id as the format requires.
class PprofBuilder {
 public:
  PprofBuilder() { str(""); }  // pprof requires string_table[0] == ""

  int64_t str(const std::string& s) {
    auto [it, inserted] = strings_.try_emplace(s, static_cast<int64_t>(strings_.size()));
    if (inserted) out_.add_string_table(s);
    return it->second;
  }

  uint64_t location(const Frame& f) {
    auto key = std::make_tuple(f.kind, f.module, f.build_id, f.offset, f.function, f.file, f.line);
    auto it = locations_.find(key);
    if (it != locations_.end()) return it->second;

    pb::Location* loc = out_.add_location();
    loc->set_id(out_.location_size());  // ids start at 1: 0 means "none" in pprof
    loc->set_mapping_id(mapping(f));
    loc->set_address(f.offset);
    pb::Line* line = loc->add_line();
    line->set_function_id(function(f));
    line->set_line(f.line);
    locations_.emplace(std::move(key), loc->id());
    return loc->id();
  }

  pb::Profile& profile() { return out_; }

 private:
  uint64_t mapping(const Frame& f) {
    if (f.module.empty()) return 0;  // e.g. interpreter frames: no file is mapped for them
    auto key = std::make_pair(f.module, f.build_id);
    auto it = mappings_.find(key);
    pb::Mapping* m = nullptr;
    if (it == mappings_.end()) {
      m = out_.add_mapping();
      m->set_id(out_.mapping_size());
      m->set_filename(str(f.module));
      m->set_build_id(str(f.build_id));
      // Every location gets a function (unresolved ones are named module+0xoffset), so pprof
      // must not try to symbolize these mappings again with whatever binaries it finds locally.
      m->set_has_functions(true);
      mappings_.emplace(std::move(key), m->id());
    } else {
      m = out_.mutable_mapping(static_cast<int>(it->second - 1));
    }
    if (!f.file.empty()) m->set_has_filenames(true);
    if (f.line > 0) m->set_has_line_numbers(true);
    return m->id();
  }

  uint64_t function(const Frame& f) {
    std::string name = f.display_name();
    auto key = std::make_pair(name, f.file);
    auto it = functions_.find(key);
    if (it != functions_.end()) return it->second;
    pb::Function* fn = out_.add_function();
    fn->set_id(out_.function_size());
    fn->set_name(str(name));
    // strata keeps only the demangled name; pprof wants system_name set, so it repeats.
    fn->set_system_name(str(name));
    fn->set_filename(str(f.file));
    functions_.emplace(std::move(key), fn->id());
    return fn->id();
  }

  pb::Profile out_;
  std::unordered_map<std::string, int64_t> strings_;
  std::map<std::pair<std::string, std::string>, uint64_t> mappings_;
  std::map<std::pair<std::string, std::string>, uint64_t> functions_;
  std::map<std::tuple<FrameKind, std::string, std::string, uint64_t, std::string, std::string, int>, uint64_t>
      locations_;
};

Status write_gzip(const std::string& data, const std::string& path) {
  errno = 0;
  gzFile gz = gzopen(path.c_str(), "wb");
  if (gz == nullptr) {
    return Error::from_errno("cannot create pprof file " + path, errno != 0 ? errno : ENOMEM);
  }
  // gzwrite takes an unsigned length; write in chunks so any size fits.
  constexpr size_t kChunk = 1 << 20;
  bool ok = true;
  for (size_t off = 0; ok && off < data.size(); off += kChunk) {
    const size_t n = std::min(kChunk, data.size() - off);
    ok = gzwrite(gz, data.data() + off, static_cast<unsigned>(n)) == static_cast<int>(n);
  }
  int errnum = Z_OK;
  const std::string zmsg = ok ? "" : gzerror(gz, &errnum);
  const int close_rc = gzclose(gz);
  if (!ok || close_rc != Z_OK) {
    const int saved = errno;
    std::remove(path.c_str());  // a truncated file must not pass for a profile
    if (errnum == Z_ERRNO || close_rc == Z_ERRNO) {
      return Error::from_errno("cannot write pprof file " + path, saved);
    }
    return Error{"cannot write pprof file " + path + ": zlib error " +
                 (zmsg.empty() ? std::to_string(close_rc) : zmsg)};
  }
  return {};
}

}  // namespace

Status write_pprof(const Profile& p, const std::string& path) {
  PprofBuilder b;
  pb::Profile& out = b.profile();

  pb::ValueType* st = out.add_sample_type();
  // On-CPU values are sample counts; other kinds carry their own unit (off-CPU: microseconds).
  const bool counts = p.value_unit == "count";
  st->set_type(b.str(counts ? "samples" : p.kind));
  st->set_unit(b.str(p.value_unit));
  out.set_default_sample_type(st->type());
  // Sampled on-CPU profiles also carry each sample's CPU time: its count times the period of the
  // windows it came from. The cost budget lowers the rate in some windows, and one profile-wide
  // period would count a 24 Hz sample as a 99 Hz one; the time is right for every sample, and is
  // what pprof shows by default.
  const bool timed = counts && p.period_ns > 0;
  if (timed) {
    pb::ValueType* cpu = out.add_sample_type();
    cpu->set_type(b.str("cpu"));
    cpu->set_unit(b.str("nanoseconds"));
    out.set_default_sample_type(cpu->type());
  }
  if (p.period_ns > 0) {
    out.mutable_period_type()->set_type(b.str("cpu"));
    out.mutable_period_type()->set_unit(b.str("nanoseconds"));
    out.set_period(static_cast<int64_t>(p.period_ns));
  }
  out.set_time_nanos(static_cast<int64_t>(p.start_ns));
  out.set_duration_nanos(static_cast<int64_t>(p.duration_ns));

  const int64_t k_pid = b.str("pid");
  const int64_t k_tid = b.str("tid");
  const int64_t k_thread = b.str("thread");
  const int64_t k_rank = b.str("rank");
  const int64_t k_node = b.str("node");
  const int64_t k_job = b.str("job");
  const int64_t k_period = b.str("sample_period");
  const int64_t k_ns = b.str("nanoseconds");

  // Location ids per stack, computed once: many samples share a stack.
  std::vector<std::vector<uint64_t>> stack_locations(p.stacks.size());
  std::vector<bool> stack_done(p.stacks.size(), false);

  for (const auto& s : p.samples) {
    if (s.count == 0) continue;  // as in the folded output
    pb::Sample* ps = out.add_sample();
    if (s.stack_index < p.stacks.size()) {
      auto& ids = stack_locations[s.stack_index];
      if (!stack_done[s.stack_index]) {
        for (const Frame& f : p.stacks[s.stack_index]) ids.push_back(b.location(f));  // leaf first
        stack_done[s.stack_index] = true;
      }
      for (uint64_t id : ids) ps->add_location_id(id);
    }
    ps->add_value(static_cast<int64_t>(s.count));
    if (timed) ps->add_value(static_cast<int64_t>(s.count * p.period_of(s)));

    pb::Label* l = ps->add_label();
    l->set_key(k_pid);
    l->set_num(s.pid);
    l = ps->add_label();
    l->set_key(k_tid);
    l->set_num(s.tid);
    if (!s.comm.empty()) {
      l = ps->add_label();
      l->set_key(k_thread);
      l->set_str(b.str(s.comm));
    }
    // Samples taken at another rate than the profile's period say theirs (pprof -tagfocus).
    if (timed && p.period_of(s) != p.period_ns) {
      l = ps->add_label();
      l->set_key(k_period);
      l->set_num(static_cast<int64_t>(p.period_of(s)));
      l->set_num_unit(k_ns);
    }
    // Rank, node and job, so Pyroscope and Parca can split and filter a job's profile by them.
    if (auto it = p.processes.find(s.pid); it != p.processes.end()) {
      const ProcessLabels& who = it->second;
      if (who.rank >= 0) {
        l = ps->add_label();
        l->set_key(k_rank);
        l->set_num(who.rank);
      }
      if (!who.node.empty()) {
        l = ps->add_label();
        l->set_key(k_node);
        l->set_str(b.str(who.node));
      }
      if (!who.job.empty()) {
        l = ps->add_label();
        l->set_key(k_job);
        l->set_str(b.str(who.job));
      }
    }
  }

  std::string data;
  if (!out.SerializeToString(&data)) {
    return Error{"cannot write pprof file " + path + ": profile does not serialize"};
  }
  return write_gzip(data, path);
}

}  // namespace strata::report
