#include "agent/os/os_metrics.h"

#include <algorithm>

#include "agent/os/histogram.h"

namespace strata::agent::os {
namespace {

uint64_t delta(uint64_t before, uint64_t now) { return now >= before ? now - before : 0; }

class Out {
 public:
  Out(uint32_t pid, std::vector<store::Metric>& v) : pid_(pid), v_(v) {}
  void add(const std::string& name, double value, const std::string& label = "") {
    v_.push_back(store::Metric{pid_, name, label, value});
  }

 private:
  uint32_t pid_;
  std::vector<store::Metric>& v_;
};

void histogram_metrics(Out& out, const std::string& name, const __u64* before, const __u64* now,
                       double sum_us) {
  std::vector<uint64_t> buckets(kHistBuckets);
  for (unsigned b = 0; b < kHistBuckets; ++b) buckets[b] = delta(before ? before[b] : 0, now[b]);
  HistSummary s = summarize(buckets);
  out.add(name + ".count", static_cast<double>(s.count));
  if (s.count == 0) return;
  out.add(name + ".mean", sum_us / static_cast<double>(s.count));
  out.add(name + ".p50", s.p50);
  out.add(name + ".p90", s.p90);
  out.add(name + ".p99", s.p99);
  out.add(name + ".max", s.max);
  for (unsigned b = 0; b < kHistBuckets; ++b) {
    if (buckets[b]) out.add(name + ".hist", static_cast<double>(buckets[b]), "le=" + std::to_string(hist_upper(b)));
  }
}

// Where the process ran (os.cpu_time_by_cpu_us, label the CPU's number): the CPUs that held at
// least kPlacementMinShare of its run time, at most kPlacementCpus of them, most first, and the rest
// summed as "other". A rank confined to one CPU (pinned, or left there by the scheduler) is one row;
// one spread over a 128-CPU node is five, not 128. What the diagnosis needs is whether the ranks
// that run the same work slower share one CPU (a slower core: its clock, its SMT sibling, a
// hypervisor's steal), which the largest shares say.
constexpr double kPlacementMinShare = 0.05;  // a twentieth: under it a CPU is a migration's visit
constexpr size_t kPlacementCpus = 4;         // a process confined to a few CPUs names them all
void cpu_placement(Out& out, const std::vector<double>& cpu_ns, uint64_t total_ns) {
  if (total_ns == 0) return;
  std::vector<std::pair<double, unsigned>> by_time;
  for (unsigned c = 0; c < cpu_ns.size(); ++c)
    if (cpu_ns[c] >= kPlacementMinShare * static_cast<double>(total_ns)) by_time.push_back({cpu_ns[c], c});
  std::sort(by_time.begin(), by_time.end(), [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  if (by_time.size() > kPlacementCpus) by_time.resize(kPlacementCpus);
  double named = 0;
  for (const auto& [ns, c] : by_time) {
    out.add("os.cpu_time_by_cpu_us", ns / 1000, std::to_string(c));
    named += ns;
  }
  const double rest = static_cast<double>(total_ns) - named;
  if (rest > 0) out.add("os.cpu_time_by_cpu_us", rest / 1000, "other");
}

}  // namespace

const char* reason_name(unsigned reason) {
  switch (reason) {
    case STRATA_OFFCPU_PREEMPTED: return "preempted";
    case STRATA_OFFCPU_SLEEP: return "sleep";
    case STRATA_OFFCPU_IO: return "io";
    case STRATA_OFFCPU_UNINTERRUPTIBLE: return "uninterruptible";
    default: return "other";
  }
}

std::vector<store::Metric> process_metrics(uint32_t pid, const ProcSnapshot& before, const ProcSnapshot& now,
                                           const MetricInputs& in) {
  std::vector<store::Metric> v;
  Out out(pid, v);

  std::vector<double> cpu_share;  // this window's run time per CPU, for neighbour weighting
  if (now.sched) {
    const auto& n = *now.sched;
    const strata_sched_stats* b = before.sched ? &*before.sched : nullptr;
    uint64_t cpu_total = 0;
    cpu_share.resize(STRATA_OS_MAX_CPUS);
    for (unsigned c = 0; c < STRATA_OS_MAX_CPUS; ++c) {
      uint64_t d = delta(b ? b->cpu_ns[c] : 0, n.cpu_ns[c]);
      cpu_share[c] = static_cast<double>(d);
      cpu_total += d;
    }
    out.add("os.cpu_time_us", static_cast<double>(cpu_total) / 1000);
    cpu_placement(out, cpu_share, cpu_total);
    for (auto& s : cpu_share) s = cpu_total ? s / static_cast<double>(cpu_total) : 0;
    out.add("os.runq_wait_us", static_cast<double>(delta(b ? b->runq_ns : 0, n.runq_ns)) / 1000);
    histogram_metrics(out, "os.runq_latency_us", b ? b->runq_hist : nullptr, n.runq_hist,
                      static_cast<double>(delta(b ? b->runq_ns : 0, n.runq_ns)) / 1000);
    out.add("os.voluntary_switches", static_cast<double>(delta(b ? b->voluntary : 0, n.voluntary)));
    out.add("os.involuntary_switches", static_cast<double>(delta(b ? b->involuntary : 0, n.involuntary)));
    out.add("os.migrations", static_cast<double>(delta(b ? b->migrations : 0, n.migrations)));
    for (unsigned r = 0; r < STRATA_OFFCPU_REASONS; ++r) {
      out.add("os.blocked_us", static_cast<double>(delta(b ? b->offcpu_ns[r] : 0, n.offcpu_ns[r])) / 1000,
              reason_name(r));
    }
  }

  for (const auto& [key, ns] : now.irq_ns) {
    auto it = before.irq_ns.find(key);
    uint64_t d = delta(it != before.irq_ns.end() ? it->second : 0, ns);
    if (d == 0) continue;
    auto [kind, vector] = key;
    if (kind == STRATA_IRQ_SOFT) {
      out.add("os.softirq_time_us", static_cast<double>(d) / 1000, softirq_name(vector));
    } else {
      std::string label = std::to_string(vector);
      if (in.irq_names) {
        auto n = in.irq_names->find(vector);
        if (n != in.irq_names->end()) label += ":" + n->second;
      }
      out.add("os.irq_time_us", static_cast<double>(d) / 1000, label);
    }
  }

  if (now.os) {
    const auto& n = *now.os;
    const strata_os_stats* b = before.os ? &*before.os : nullptr;
    const char* kinds[2] = {"global", "memcg"};
    for (int i = 0; i < 2; ++i) {
      out.add("os.direct_reclaim_count", static_cast<double>(delta(b ? b->reclaim_count[i] : 0, n.reclaim_count[i])),
              kinds[i]);
      out.add("os.direct_reclaim_us", static_cast<double>(delta(b ? b->reclaim_ns[i] : 0, n.reclaim_ns[i])) / 1000,
              kinds[i]);
    }
    out.add("os.compaction_stall_count", static_cast<double>(delta(b ? b->compaction_count : 0, n.compaction_count)));
    out.add("os.compaction_stall_us", static_cast<double>(delta(b ? b->compaction_ns : 0, n.compaction_ns)) / 1000);
    uint64_t bios = delta(b ? b->bio_count : 0, n.bio_count);
    out.add("os.bio_count", static_cast<double>(bios));
    if (bios) {
      double sum_us = static_cast<double>(delta(b ? b->bio_ns : 0, n.bio_ns)) / 1000;
      std::vector<uint64_t> buckets(kHistBuckets);
      for (unsigned i = 0; i < kHistBuckets; ++i) buckets[i] = delta(b ? b->bio_hist[i] : 0, n.bio_hist[i]);
      HistSummary s = summarize(buckets);
      out.add("os.bio_latency_us.mean", sum_us / static_cast<double>(bios));
      out.add("os.bio_latency_us.p50", s.p50);
      out.add("os.bio_latency_us.p99", s.p99);
      out.add("os.bio_latency_us.max", s.max);
      for (unsigned i = 0; i < kHistBuckets; ++i)
        if (buckets[i]) out.add("os.bio_latency_us.hist", static_cast<double>(buckets[i]), "le=" + std::to_string(hist_upper(i)));
    }
    out.add("os.tcp_retransmits", static_cast<double>(in.tcp_retransmits));
  }

  if (now.faults) {
    Faults b = before.faults.value_or(Faults{});
    out.add("os.minor_faults", static_cast<double>(delta(b.minor, now.faults->minor)));
    out.add("os.major_faults", static_cast<double>(delta(b.major, now.faults->major)));
  }

  if (now.cpu_stat && now.cpu_stat->has_throttling) {
    CpuStat b = before.cpu_stat && before.cgroup == now.cgroup ? *before.cpu_stat : *now.cpu_stat;
    const auto& n = *now.cpu_stat;
    out.add("os.cgroup_nr_periods", static_cast<double>(delta(b.nr_periods, n.nr_periods)), now.cgroup);
    out.add("os.cgroup_nr_throttled", static_cast<double>(delta(b.nr_throttled, n.nr_throttled)), now.cgroup);
    out.add("os.cgroup_throttled_us", static_cast<double>(delta(b.throttled_us, n.throttled_us)), now.cgroup);
  }

  // TCP connections that moved data in the window, labelled "local>remote": the sender's smoothed
  // RTT, the bytes each way, and the sender's busy time (bytes over it: the rate its path moved them,
  // which shows a rate-limited link that RTT does not: TCP queues the excess in the socket). The endpoints pair a connection's two sides across ranks (and
  // nodes), so the diagnosis can tell which rank is on every slow link.
  if (!now.tcp.empty()) {
    std::map<std::string, const TcpLink*> prior;
    for (const auto& l : before.tcp) prior[l.local + ">" + l.remote] = &l;
    struct Moved {
      std::string label;
      uint64_t sent, received, srtt_us, busy_us;
    };
    std::vector<Moved> moved;
    for (const auto& l : now.tcp) {
      std::string label = l.local + ">" + l.remote;
      auto it = prior.find(label);
      uint64_t sent = delta(it != prior.end() ? it->second->bytes_acked : 0, l.bytes_acked);
      uint64_t recv = delta(it != prior.end() ? it->second->bytes_received : 0, l.bytes_received);
      uint64_t busy = delta(it != prior.end() ? it->second->busy_us : 0, l.busy_us);
      if (sent + recv > 0) moved.push_back({std::move(label), sent, recv, l.srtt_us, busy});
    }
    std::sort(moved.begin(), moved.end(),
              [](const Moved& a, const Moved& b) { return a.sent + a.received > b.sent + b.received; });
    if (moved.size() > in.max_tcp_links) moved.resize(in.max_tcp_links);
    for (const auto& m : moved) {
      if (m.sent) {
        out.add("net.tcp_sent_bytes", static_cast<double>(m.sent), m.label);
        out.add("net.tcp_srtt_us", static_cast<double>(m.srtt_us), m.label);
        if (m.busy_us) out.add("net.tcp_busy_us", static_cast<double>(m.busy_us), m.label);
      }
      if (m.received) out.add("net.tcp_received_bytes", static_cast<double>(m.received), m.label);
    }
  }

  if (!cpu_share.empty()) {
    std::map<std::pair<uint32_t, std::string>, double> by_proc;  // (tgid, comm) -> weighted ns
    for (const auto& nb : in.neighbours) {
      if (nb.tgid == pid || nb.cpu >= cpu_share.size() || cpu_share[nb.cpu] == 0) continue;
      by_proc[{nb.tgid, nb.comm}] += static_cast<double>(nb.run_ns) * cpu_share[nb.cpu];
    }
    std::vector<std::pair<double, std::string>> ranked;
    for (const auto& [k, ns] : by_proc) {
      double us = ns / 1000;
      if (us >= in.min_neighbour_us) ranked.push_back({us, k.second + ":" + std::to_string(k.first)});
    }
    std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    if (ranked.size() > in.max_neighbours) ranked.resize(in.max_neighbours);
    for (const auto& [us, label] : ranked) out.add("os.neighbour_run_us", us, label);
  }
  return v;
}

}  // namespace strata::agent::os
