// Collectors that share one store (a sharded ClickHouse) split its jobs: each job is diagnosed by
// one live collector, the one that ranks highest for it (rendezvous hashing over the collectors'
// heartbeats in the store), so the job is diagnosed once, with every rank in view, and when a
// collector stops only its jobs move. A collector that gets new data for a job it does not own
// notes the job in the store; the owner reads those notes every round. On a store only one
// collector writes, every job is its own and nothing is read or written.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "store/store.h"

namespace strata::server {

class JobSharing {
 public:
  JobSharing(store::Ledger& store, std::mutex& store_mu, std::string self, std::ostream& log);

  // From the jobs this collector got new data for: the ones it diagnoses now, with those other
  // collectors noted for it. Call once per round (it is also the heartbeat).
  std::set<std::string> take(const std::set<std::string>& seen, uint64_t now_ns);

  // Tells the others this collector is alive (between rounds; take() does it in a round).
  void heartbeat(uint64_t now_ns);

  // The collector that diagnoses `job` among `live` (sorted ids); empty when none is.
  static std::string owner(const std::string& job, const std::vector<std::string>& live);

  bool shared() const { return store_.shared(); }
  uint64_t handed_over() const { return handed_over_; }  // jobs left to another collector so far

  // A collector silent this long is gone and its jobs move: 15 rounds at the default pace of 2 s,
  // several times the longest round of a large job measured here.
  static constexpr uint64_t kTtlNs = 30'000'000'000ull;

 private:
  store::Ledger& store_;
  std::mutex& store_mu_;
  std::string self_;
  std::ostream& log_;
  uint64_t notes_since_ns_ = 0;              // the notes read so far are older than this
  std::map<std::string, uint64_t> noted_;    // per job, the newest note already acted on
  uint64_t handed_over_ = 0;
  uint64_t errors_logged_ = 0;
};

}  // namespace strata::server
