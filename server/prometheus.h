// Prometheus text exposition for /metrics (the collector's and the agent's): every family with HELP
// and TYPE, and cumulative histograms. Plain code over an ostream; no client library in Debian fits
// (prometheus-cpp is not packaged for bookworm).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace strata::server::prom {

// "# HELP name help" and "# TYPE name type": once per family, before its samples.
inline void family(std::ostream& o, const std::string& name, const char* type, const std::string& help) {
  o << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
}

// A histogram of durations (seconds) over fixed upper bounds; not thread-safe (callers lock).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size(), 0) {}

  void observe(double v) {
    for (size_t i = 0; i < bounds_.size(); ++i) {
      if (v <= bounds_[i]) {
        counts_[i]++;
        break;
      }
    }
    sum_ += v;
    count_++;
  }

  // NAME_bucket{LABELS,le=".."} (cumulative, +Inf last), NAME_sum, NAME_count. `labels` is empty or
  // 'key="value",...' without braces.
  void write(std::ostream& o, const std::string& name, const std::string& labels) const {
    const std::string sep = labels.empty() ? "" : ",";
    uint64_t cumulative = 0;
    for (size_t i = 0; i < bounds_.size(); ++i) {
      cumulative += counts_[i];
      o << name << "_bucket{" << labels << sep << "le=\"" << bounds_[i] << "\"} " << cumulative << "\n";
    }
    o << name << "_bucket{" << labels << sep << "le=\"+Inf\"} " << count_ << "\n";
    const std::string braces = labels.empty() ? "" : "{" + labels + "}";
    o << name << "_sum" << braces << " " << sum_ << "\n" << name << "_count" << braces << " " << count_ << "\n";
  }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

// Request durations: from a static file (~1 ms) to the 1,000-rank heatmap (~0.7 s before gzip was
// preferred to brotli) and a whole-job export (seconds); past 30 s a client has given up.
inline const std::vector<double>& request_buckets() {
  static const std::vector<double> b = {0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
  return b;
}

// One job's diagnosis (load, diagnose, keep): tens of ms at 4 ranks, seconds at 1,000 and more.
inline const std::vector<double>& diagnosis_buckets() {
  static const std::vector<double> b = {0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  return b;
}

}  // namespace strata::server::prom
