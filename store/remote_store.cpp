// A collector's data read through its REST API (GET /api/v1/export and /api/v1/launch_samples,
// protobuf): what `strata report --server` (and `strata diagnose --server`) read in place of a file.
// Read only.
#include <httplib.h>

#include <algorithm>
#include <map>

#include "common/http_error.h"
#include "ingest.pb.h"
#include "store/catalog.h"
#include "store/store.h"

namespace strata::store {
namespace {

class RemoteStore final : public Reader {
 public:
  RemoteStore(std::string url, std::string token) : url_(std::move(url)), token_(std::move(token)) {}

  Status check() {
    auto e = fetch(ProfileFilter{});
    if (!e) return e.error();
    return {};
  }

  // -- reading
  Result<Profile> load_profile(const ProfileFilter& f) override {
    auto fetched = fetch(f);
    if (!fetched) return fetched.error();
    const ingest::Export* e = *fetched;
    Profile p;
    p.kind = e->profile_kind();
    p.value_unit = e->value_unit();
    p.period_ns = e->period_ns();
    p.start_ns = e->start_ns();
    p.duration_ns = e->duration_ns();
    for (const auto& st : e->stacks()) p.stacks.push_back(stack_of(st));
    for (const auto& s : e->samples()) {
      ProfileSample smp;
      smp.pid = s.pid();
      smp.tid = s.tid();
      smp.comm = s.thread_comm();
      smp.stack_index = static_cast<uint32_t>(s.stack());  // out of range reads as empty (profile.h)
      smp.count = s.value();
      smp.period_ns = s.period_ns();
      p.samples.push_back(std::move(smp));
    }
    return p;
  }

  Result<std::vector<ProcessInfo>> processes(std::optional<int64_t>) override {
    auto e = cached();
    if (!e) return e.error();
    std::vector<ProcessInfo> out;
    for (const auto& p : (*e)->processes()) {
      ProcessInfo r;
      r.pid = p.pid();
      r.ppid = p.ppid();
      r.start_ns = p.start_ns();
      r.node = p.node();
      r.comm = p.comm();
      r.command = p.command();
      r.job = p.job();
      r.rank = p.rank();
      r.local_rank = p.local_rank();
      r.world_size = p.world_size();
      r.pod_uid = p.pod_uid();
      r.container_id = p.container_id();
      r.pod_name = p.pod_name();
      r.pod_namespace = p.pod_namespace();
      out.push_back(std::move(r));
    }
    return out;
  }

  Result<std::vector<std::pair<std::string, double>>> stats(int64_t) override {
    auto e = cached();
    if (!e) return e.error();
    std::vector<std::pair<std::string, double>> out;
    for (const auto& s : (*e)->stats()) out.emplace_back(s.key(), s.value());
    return out;
  }

  Result<std::optional<int64_t>> latest_recording() override {
    auto e = cached();
    if (!e) return e.error();
    if ((*e)->latest_recording() == 0) return std::optional<int64_t>{};
    return std::optional<int64_t>{(*e)->latest_recording()};
  }

  // The collector's latest step, as its latest export said (its default span ends there).
  Result<std::optional<uint64_t>> latest_step_ns(std::optional<int64_t> recording) override {
    if (recording) return Error{"a remote store's latest step is of every recording"};
    auto e = cached();
    if (!e) return e.error();
    if ((*e)->latest_step_ns() == 0) return std::optional<uint64_t>{};
    return std::optional<uint64_t>{(*e)->latest_step_ns()};
  }

  Result<std::vector<ReducedFidelity>> reduced_fidelity(std::optional<int64_t>, std::optional<uint64_t> from_ns,
                                                        std::optional<uint64_t> to_ns) override {
    auto e = cached();
    if (!e) return e.error();
    std::vector<ReducedFidelity> out;
    for (const auto& r : (*e)->reduced_fidelity())
      if ((!from_ns || r.end_ns() > *from_ns) && (!to_ns || r.start_ns() < *to_ns)) out.push_back({r.recording(), r.node(), r.start_ns(), r.end_ns(), r.windows(), r.configured_hz(), r.sample_hz(),
                     r.unwinding()});
    return out;
  }

  Result<unsigned> sample_hz(std::optional<int64_t>) override {
    auto e = cached();
    if (!e) return e.error();
    return (*e)->sample_hz();
  }

  Result<std::vector<MetricRow>> metrics(const std::string& prefix, std::optional<int64_t>) override {
    auto e = cached();
    if (!e) return e.error();
    std::vector<MetricRow> out;
    for (const auto& m : (*e)->metrics()) {
      for (const auto& x : m.metrics()) {
        if (x.name().compare(0, prefix.size(), prefix) != 0) continue;
        MetricRow r;
        r.start_ns = m.start_ns();
        r.end_ns = m.end_ns();
        r.metric = catalog::from_message(catalog::kMetrics, x);
        out.push_back(std::move(r));
      }
    }
    return out;
  }

  // Through GET /api/v1/launch_samples?format=proto, a page (kPageRows) per request until the
  // query's limit or the last row. Stacks are merged across pages by content, so each is listed once.
  // Pages are read by offset: rows ingested meanwhile may shift a row from one page to the next.
  Result<LaunchSamples> query_launch_samples(const RowQuery& q) override {
    LaunchSamples out;
    std::map<std::string, uint32_t> index_of;  // a StackDef's frames, serialized -> index in out.stacks
    uint64_t offset = q.offset;
    for (;;) {
      const uint64_t want = q.limit ? std::min<uint64_t>(q.limit - out.rows.size(), kPageRows) : kPageRows;
      std::string path = "/api/v1/launch_samples?format=proto&offset=" + std::to_string(offset) +
                         "&limit=" + std::to_string(want) + "&prefix=" + httplib::detail::encode_query_param(q.prefix);
      if (q.recording) path += "&recording=" + std::to_string(*q.recording);
      if (q.node) path += "&node=" + httplib::detail::encode_query_param(*q.node);
      if (q.pid) path += "&pid=" + std::to_string(*q.pid);
      if (q.from_ns) path += "&from=" + std::to_string(*q.from_ns);
      if (q.to_ns) path += "&to=" + std::to_string(*q.to_ns);
      auto body = get(path);
      if (!body) return body.error();
      ingest::LaunchSamplePage page;
      if (!page.ParseFromString(*body)) return Error{url_ + ": the answer is not a strata.ingest.LaunchSamplePage"};
      std::vector<uint32_t> index(static_cast<size_t>(page.stacks_size()));
      for (int i = 0; i < page.stacks_size(); ++i) {
        ingest::StackDef frames_only = page.stacks(i);
        frames_only.clear_local_id();
        auto [it, added] = index_of.emplace(frames_only.SerializeAsString(), static_cast<uint32_t>(out.stacks.size()));
        if (added) out.stacks.push_back(stack_of(page.stacks(i)));
        index[static_cast<size_t>(i)] = it->second;
      }
      for (const auto& x : page.rows()) {
        if (x.stack_index() >= index.size()) return Error{url_ + ": a launch sample names a stack the answer lacks"};
        LaunchSampleRow r;
        r.node = x.node();
        r.start_ns = x.start_ns();
        r.end_ns = x.end_ns();
        r.sample = catalog::from_message(catalog::kLaunchSamples, x.sample());
        r.stack_index = index[x.stack_index()];
        out.rows.push_back(std::move(r));
      }
      const auto n = static_cast<uint64_t>(page.rows_size());
      offset += n;
      if (n < want || (q.limit && out.rows.size() >= q.limit)) return out;
    }
  }

  // Not in the export yet (chrome-trace and diagnosis over --server need them): say so.
  Result<std::vector<CommunicatorRecord>> communicators(std::optional<int64_t>) override { return not_yet(); }
  Result<std::vector<CollectiveRecord>> collectives(std::optional<int64_t>, std::optional<uint32_t>) override {
    return not_yet();
  }
  Result<std::vector<DeviceActivity>> device_activity(std::optional<int64_t>, std::optional<uint32_t>) override {
    return not_yet();
  }
  Result<std::vector<StepRecord>> steps(std::optional<int64_t>, std::optional<uint32_t>) override { return not_yet(); }
  Result<std::vector<ThreadWindow>> thread_windows(const RowQuery&) override { return not_yet(); }

 private:
  static Error not_yet() {
    return Error{"this report needs the timeline, which the server's export does not carry yet: use a store file"};
  }

  Result<const ingest::Export*> cached() {
    if (!export_) {
      auto e = fetch(ProfileFilter{});
      if (!e) return e.error();
    }
    return &*export_;
  }

  // Rows per request of a paged read: the server's default page (server/web_api.h kDefaultPageRows),
  // about a megabyte of launch samples.
  static constexpr uint64_t kPageRows = 10'000;

  static Stack stack_of(const ingest::StackDef& s) {
    Stack out;
    for (const auto& fr : s.frames()) {
      Frame x;
      x.kind = fr.kind() <= 3 ? static_cast<FrameKind>(fr.kind()) : FrameKind::kNative;
      x.build_id = fr.build_id();
      x.module = fr.module();
      x.offset = fr.offset();
      x.function = fr.function();
      x.file = fr.file();
      x.line = fr.line();
      out.push_back(std::move(x));
    }
    return out;
  }

  Result<std::string> get(const std::string& path) { return remote_get(url_, token_, path); }

  Result<const ingest::Export*> fetch(const ProfileFilter& f) {
    std::string path = "/api/v1/export?kind=" + std::string(f.kind == CountKind::kOnCpu ? "oncpu" : "offcpu");
    if (f.rank) path += "&rank=" + std::to_string(*f.rank);
    if (f.job) path += "&job=" + httplib::detail::encode_query_param(*f.job);
    if (f.pid) path += "&pid=" + std::to_string(*f.pid);
    if (f.tid) path += "&tid=" + std::to_string(*f.tid);
    // The export held already covers this span when it was asked with the same filter and the
    // server read exactly this span for it (its default span, which `strata report --server` asks
    // for by name after the first read told it the latest step): no second read of the same rows.
    if (export_ && path == export_base_ && f.from_ns && f.to_ns && export_->span_from_ns() == *f.from_ns &&
        export_->span_to_ns() == *f.to_ns)
      return &*export_;
    const std::string base = path;
    if (f.from_ns) path += "&from=" + std::to_string(*f.from_ns);
    if (f.to_ns) path += "&to=" + std::to_string(*f.to_ns);
    auto body = get(path);
    if (!body) return body.error();
    ingest::Export e;
    if (!e.ParseFromString(*body)) return Error{url_ + ": the export is not a strata.ingest.Export"};
    export_ = std::move(e);
    export_base_ = base;
    return &*export_;
  }

  std::string url_;
  std::string token_;
  std::optional<ingest::Export> export_;
  std::string export_base_;  // the request export_ answered, without its span
};

}  // namespace

Result<std::string> remote_get(std::string url, const std::string& token, const std::string& path, int read_timeout_s) {
  while (!url.empty() && url.back() == '/') url.pop_back();
  httplib::Client cli(url);
  if (!cli.is_valid()) return Error{"--server " + url + ": expected http://HOST:PORT"};
  cli.set_connection_timeout(5, 0);
  cli.set_read_timeout(read_timeout_s, 0);
  httplib::Headers h;
  if (!token.empty()) h.emplace("Authorization", "Bearer " + token);
  auto res = cli.Get(path, h);
  if (!res) return Error{"cannot reach the collector at " + url + ": " + http_error_text(res.error())}.environment();
  if (res->status == 200) return std::move(res->body);
  if (res->status == 401) return Error{url + ": 401 unauthorized (give the collector's token with --token-file)"};
  // The collector's refusal says why, on one line.
  std::string why = res->body.substr(0, std::min(res->body.find('\n'), size_t{300}));
  Error e{url + ": HTTP " + std::to_string(res->status) + (why.empty() ? "" : ": " + why)};
  // Busy, or a node's agent that did not answer: the environment, not the request.
  return res->status == 502 || res->status == 503 ? e.environment() : e;
}

Result<std::unique_ptr<Reader>> Store::open_remote(const std::string& url, const std::string& token) {
  if (url.rfind("http://", 0) != 0) return Error{"--server " + url + ": expected http://HOST:PORT"};
  std::string u = url;
  while (!u.empty() && u.back() == '/') u.pop_back();
  auto s = std::make_unique<RemoteStore>(u, token);
  if (auto st = s->check(); !st) return st.error();
  return std::unique_ptr<Reader>(std::move(s));
}

}  // namespace strata::store
