// A store::Reader that forwards every read to another: tests derive from it and override the one
// read they count or check, so that everything else behaves as the store does.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "store/store.h"

namespace strata::test {

class ForwardingReader : public store::Reader {
 public:
  explicit ForwardingReader(store::Reader& s) : s_(s) {}

  Result<Profile> load_profile(const store::ProfileFilter& f) override { return s_.load_profile(f); }
  Result<std::vector<store::ProcessInfo>> processes(std::optional<int64_t> rec) override { return s_.processes(rec); }
  Result<std::vector<std::pair<std::string, double>>> stats(int64_t rec) override { return s_.stats(rec); }
  Result<std::optional<int64_t>> latest_recording() override { return s_.latest_recording(); }
  Result<std::vector<store::CommunicatorRecord>> communicators(std::optional<int64_t> rec) override {
    return s_.communicators(rec);
  }
  Result<std::vector<store::CollectiveRecord>> collectives(std::optional<int64_t> rec, std::optional<uint32_t> pid) override {
    return s_.collectives(rec, pid);
  }
  Result<std::vector<store::DeviceActivity>> device_activity(std::optional<int64_t> rec,
                                                             std::optional<uint32_t> pid) override {
    return s_.device_activity(rec, pid);
  }
  Result<std::vector<store::StepRecord>> steps(std::optional<int64_t> rec, std::optional<uint32_t> pid) override {
    return s_.steps(rec, pid);
  }
  Result<std::optional<uint64_t>> latest_step_ns(std::optional<int64_t> rec) override { return s_.latest_step_ns(rec); }
  uint64_t read_work() const override { return s_.read_work(); }
  Result<std::optional<uint64_t>> data_version() override { return s_.data_version(); }
  Result<std::optional<store::WriteSeqs>> write_seqs() override { return s_.write_seqs(); }
  Result<std::vector<store::StepRecord>> query_steps(const store::RowQuery& q) override { return s_.query_steps(q); }
  Result<std::vector<store::CollectiveRecord>> query_collectives(const store::RowQuery& q) override {
    return s_.query_collectives(q);
  }
  Result<std::vector<store::DeviceActivity>> query_device_activity(const store::RowQuery& q) override {
    return s_.query_device_activity(q);
  }
  Result<std::vector<MetricRow>> query_metrics(const store::RowQuery& q) override { return s_.query_metrics(q); }
  Result<store::LaunchSamples> query_launch_samples(const store::RowQuery& q) override {
    return s_.query_launch_samples(q);
  }
  Result<std::vector<ThreadWindow>> thread_windows(const store::RowQuery& q) override { return s_.thread_windows(q); }
  Result<unsigned> sample_hz(std::optional<int64_t> rec) override { return s_.sample_hz(rec); }
  Result<std::vector<store::ReducedFidelity>> reduced_fidelity(std::optional<int64_t> rec, std::optional<uint64_t> from_ns,
                                                               std::optional<uint64_t> to_ns) override {
    return s_.reduced_fidelity(rec, from_ns, to_ns);
  }
  Result<std::vector<MetricRow>> metrics(const std::string& prefix, std::optional<int64_t> rec) override {
    return s_.metrics(prefix, rec);
  }

 private:
  store::Reader& s_;
};

}  // namespace strata::test
