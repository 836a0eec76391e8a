#include "report/os_table.h"

#include <algorithm>
#include <cstdio>
#include <map>

namespace strata::report {
namespace {

struct Totals {
  std::map<std::string, double> sum;                       // name -> total over labels and windows
  std::map<std::string, std::map<std::string, double>> by_label;  // name -> label -> total
};

std::string fmt_us(double us) {
  char buf[32];
  if (us >= 1e6) std::snprintf(buf, sizeof buf, "%.2f s", us / 1e6);
  else if (us >= 1e3) std::snprintf(buf, sizeof buf, "%.1f ms", us / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f us", us);
  return buf;
}

std::string fmt_n(double n) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f", n);
  return buf;
}

// The q-quantile of a histogram given as "le=N" -> count: the smallest N covering q of the total.
double quantile(const std::map<std::string, double>& hist, double q) {
  std::vector<std::pair<double, double>> b;
  double total = 0;
  for (const auto& [label, count] : hist) {
    if (label.rfind("le=", 0) != 0) continue;
    b.push_back({std::stod(label.substr(3)), count});
    total += count;
  }
  if (total <= 0) return 0;
  std::sort(b.begin(), b.end());
  double cum = 0;
  for (const auto& [le, count] : b) {
    cum += count;
    if (cum >= q * total - 1e-9) return le;
  }
  return b.back().first;
}

std::string top_labels(const std::map<std::string, double>& m, size_t n) {
  std::vector<std::pair<double, std::string>> v;
  for (const auto& [label, value] : m)
    if (value > 0) v.push_back({value, label});
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string s;
  for (size_t i = 0; i < v.size() && i < n; ++i) s += (i ? ", " : "") + v[i].second + " " + fmt_us(v[i].first);
  if (v.size() > n) s += ", ...";
  return s;
}

}  // namespace

void write_os_table(const std::vector<OsProcess>& processes, const std::vector<OsMetricRow>& rows, std::ostream& out) {
  std::map<uint32_t, Totals> per_pid;
  for (const auto& r : rows) {
    if (r.name.rfind("os.", 0) != 0) continue;
    auto& t = per_pid[r.pid];
    t.sum[r.name] += r.value;
    t.by_label[r.name][r.label] += r.value;
  }
  if (per_pid.empty()) return;
  out << "OS layer (per process, summed over the recording):\n";
  for (const auto& p : processes) {
    auto it = per_pid.find(p.pid);
    if (it == per_pid.end()) continue;
    auto& s = it->second.sum;
    auto& l = it->second.by_label;
    out << "  ";
    if (p.rank >= 0) out << "rank " << p.rank << "  ";
    out << "pid " << p.pid << "  " << p.comm << "\n";
    const auto& rq = l["os.runq_latency_us.hist"];
    out << "    cpu " << fmt_us(s["os.cpu_time_us"]);
    // Where it ran ("CPU 3 1.2 s, CPU 0 80 ms"): a straggler confined to one CPU beside peers on others.
    if (s["os.cpu_time_by_cpu_us"] > 0) {
      std::map<std::string, double> on;
      for (const auto& [cpu, us] : l["os.cpu_time_by_cpu_us"]) on[cpu == "other" ? "other CPUs" : "CPU " + cpu] = us;
      out << " (" << top_labels(on, 3) << ")";
    }
    out << "; run-queue wait " << fmt_us(s["os.runq_wait_us"]);
    if (s["os.runq_latency_us.count"] > 0) {
      out << " (latency p50 " << fmt_us(quantile(rq, 0.5)) << ", p99 " << fmt_us(quantile(rq, 0.99)) << ", max "
          << fmt_us(quantile(rq, 1.0)) << " over " << fmt_n(s["os.runq_latency_us.count"]) << " waits)";
    }
    out << "\n    switches " << fmt_n(s["os.involuntary_switches"]) << " involuntary, "
        << fmt_n(s["os.voluntary_switches"]) << " voluntary; " << fmt_n(s["os.migrations"]) << " migrations\n";
    if (s["os.blocked_us"] > 0) out << "    blocked: " << top_labels(l["os.blocked_us"], 5) << "\n";
    if (s["os.irq_time_us"] > 0 || s["os.softirq_time_us"] > 0) {
      out << "    irq " << fmt_us(s["os.irq_time_us"]);
      if (s["os.irq_time_us"] > 0) out << " (" << top_labels(l["os.irq_time_us"], 3) << ")";
      out << "; softirq " << fmt_us(s["os.softirq_time_us"]);
      if (s["os.softirq_time_us"] > 0) out << " (" << top_labels(l["os.softirq_time_us"], 3) << ")";
      out << "\n";
    }
    out << "    faults " << fmt_n(s["os.minor_faults"]) << " minor, " << fmt_n(s["os.major_faults"]) << " major";
    if (s["os.direct_reclaim_count"] > 0)
      out << "; direct reclaim " << fmt_n(s["os.direct_reclaim_count"]) << " stalls, " << fmt_us(s["os.direct_reclaim_us"]);
    if (s["os.compaction_stall_count"] > 0)
      out << "; compaction " << fmt_n(s["os.compaction_stall_count"]) << " stalls, " << fmt_us(s["os.compaction_stall_us"]);
    out << "\n";
    if (s["os.bio_count"] > 0) {
      const auto& bh = l["os.bio_latency_us.hist"];
      out << "    block I/O " << fmt_n(s["os.bio_count"]) << " requests, p50 " << fmt_us(quantile(bh, 0.5)) << ", p99 "
          << fmt_us(quantile(bh, 0.99)) << "\n";
    }
    if (s["os.tcp_retransmits"] > 0) out << "    TCP retransmits " << fmt_n(s["os.tcp_retransmits"]) << "\n";
    if (l.count("os.cgroup_nr_periods")) {
      for (const auto& [cg, periods] : l["os.cgroup_nr_periods"]) {
        if (periods <= 0) continue;
        out << "    cgroup " << cg << ": throttled " << fmt_n(l["os.cgroup_nr_throttled"][cg]) << " of "
            << fmt_n(periods) << " periods, " << fmt_us(l["os.cgroup_throttled_us"][cg]) << "\n";
      }
    }
    if (s["os.neighbour_run_us"] > 0) out << "    neighbours: " << top_labels(l["os.neighbour_run_us"], 5) << "\n";
  }
  out << "\n";
}

}  // namespace strata::report
