// The collector's diagnosis (DESIGN §6: every window): a background thread diagnoses each job that
// got new data since its last round and keeps the result in the store (the latest report per job,
// every round's findings), so the API and `strata diagnose --server` read kept findings and their
// history: when a finding first appeared, whether it is still there.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <ostream>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "common/result.h"
#include "ingest.pb.h"
#include "server/job_sharing.h"
#include "server/prometheus.h"
#include "store/store.h"

namespace strata::server {

struct DiagnoserOptions {
  double every_s = 2;  // 0: no background rounds (a job is still diagnosed when first asked for)
  // This collector's name among those that share the store (server/job_sharing.h).
  std::string collector_id = "collector";
};

struct DiagnoserCounters {
  uint64_t rounds = 0;          // rounds that found something new to look at
  uint64_t diagnosed = 0;       // job diagnoses made and kept
  uint64_t skipped = 0;         // jobs left alone: no new data since their last round
  uint64_t failed = 0;          // loads or writes that failed (no steps yet, store error)
  uint64_t handed_over = 0;     // jobs with new data here that another collector of the store diagnoses
  double seconds = 0;           // spent diagnosing, loads and writes included
  prom::Histogram job_seconds{prom::diagnosis_buckets()};  // each job's diagnosis, for /metrics
};

class Diagnoser {
 public:
  Diagnoser(store::Store& store, std::mutex& store_mu, DiagnoserOptions opts, std::ostream& log);
  ~Diagnoser();
  Diagnoser(const Diagnoser&) = delete;
  Diagnoser& operator=(const Diagnoser&) = delete;

  void start();
  void stop();

  // A store connection of the rounds' own for their reads (SQLite in WAL mode lets it read beside
  // the writer; ClickHouse is another HTTP client): a round then reads without the store mutex, and
  // ingest never waits for it. Without one, rounds read the shared store under the mutex.
  void set_reader(std::unique_ptr<store::Store> reader);

  // After a batch is applied: the processes it brought data for, and the jobs it named.
  void note(const ingest::Batch& batch);

  // Diagnoses one job now (empty: the one with the most ranks) and keeps the result; returns the
  // job's name. Takes the store mutex itself.
  Result<std::string> diagnose_job(const std::string& job);

  // The kept findings of a job, as the API answers them: the latest report (DESIGN §8 JSON, or
  // text) with the findings' history. An empty job with job_given false picks the job with the
  // most ranks. A job nothing was kept for yet is diagnosed first.
  struct Reply {
    int status = 200;
    std::string body;
    std::string content_type;
  };
  Reply findings(const std::string& job, bool job_given, bool text);

  DiagnoserCounters counters();

 private:
  void loop();
  void round();

  store::Store& store_;
  std::mutex& store_mu_;
  DiagnoserOptions opts_;
  std::ostream& log_;

  std::mutex mu_;  // guards what follows
  std::condition_variable cv_;
  bool stopping_ = false;
  std::set<std::pair<std::string, uint32_t>> dirty_procs_;  // (node, pid): pids repeat across nodes
  std::set<std::string> dirty_jobs_;
  DiagnoserCounters counters_;
  JobSharing sharing_;  // used by the round thread only

  // Where rounds read: reader_ under reader_mu_ when set, else store_ under store_mu_.
  std::unique_ptr<store::Store> reader_;
  std::mutex reader_mu_;
  template <typename F>
  auto read(F f);

  std::mutex round_mu_;  // one diagnosis at a time (the thread, or a first request)
  std::thread thread_;
};

}  // namespace strata::server
