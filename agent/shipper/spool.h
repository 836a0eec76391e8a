// The agent's on-disk queue of sealed batches: one file per batch, named by batch id, so batches
// survive a collector outage (and an agent restart) and are resent with the same ids. Bounded in
// bytes: when full, the oldest batches are dropped and counted. A batch the collector refuses as
// invalid is moved to <dir>/quarantine (the newest kQuarantineKeep kept), for a person to look at.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"

namespace strata::agent::shipper {

// Quarantined batches kept on disk: enough to show what an agent version gets wrong, bounded so
// a collector that refuses everything cannot fill the disk (each is at most one sealed batch).
inline constexpr size_t kQuarantineKeep = 16;

class Spool {
 public:
  // Creates `dir` if needed and takes over the batches already in it (a previous run's).
  static Result<Spool> open(const std::string& dir, uint64_t max_bytes);

  // Adds a batch and returns its sequence number; drops the oldest ones first when it would not
  // fit, adding their sequence numbers to `dropped`. 0: the batch was dropped itself (larger than
  // the spool, or only the batch being sent is left to drop). The files never hold more than
  // max_bytes together.
  Result<uint64_t> push(const std::string& bytes, std::vector<uint64_t>& dropped);

  struct Entry {
    std::string path;
    uint64_t seq = 0;  // order of arrival
    uint64_t bytes = 0;
  };
  std::optional<Entry> oldest() const;
  // The oldest batch, kept from being dropped until remove() or release(): the one being sent,
  // which the collector may take even while the spool overflows (it would count twice, as
  // dropped and as delivered).
  std::optional<Entry> checkout();
  // The same for the batch `seq` (nullopt when it is no longer spooled).
  std::optional<Entry> checkout(uint64_t seq);
  void release();
  // All spooled batches, oldest first.
  std::vector<Entry> entries() const;
  // Moves the batch to the quarantine folder (dropping the oldest quarantined past
  // kQuarantineKeep); returns its new path.
  Result<std::string> quarantine(const Entry& e);
  std::string quarantine_dir() const { return dir_ + "/quarantine"; }
  Result<std::string> read(const Entry& e) const;
  void remove(const Entry& e);

  uint64_t bytes() const;
  uint64_t count() const;
  uint64_t dropped() const;       // batches dropped: spool full, or not written (below)
  uint64_t write_failures() const;  // batches the disk would not take (full, read-only, failing)
  uint64_t quarantined() const;     // batches moved to quarantine (this run)

  Spool(Spool&& o) noexcept;

 private:
  Spool() = default;
  std::string dir_;
  uint64_t max_bytes_ = 0;
  mutable std::mutex mu_;
  std::vector<Entry> entries_;  // oldest first
  uint64_t bytes_ = 0;
  uint64_t next_seq_ = 1;
  uint64_t dropped_ = 0;
  uint64_t write_failures_ = 0;
  uint64_t quarantined_ = 0;
  uint64_t pinned_ = 0;  // seq of the checked-out batch, 0: none
};

}  // namespace strata::agent::shipper
