#include "server/job_sharing.h"

#include <algorithm>

namespace strata::server {
namespace {

uint64_t fnv(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// A collector's score for a job: the two names' hashes mixed by splitmix64's finalizer. FNV alone
// is a poor mixer (similar names give related hashes), and rendezvous hashing needs scores that
// are independent per collector, or the split is uneven (measured: 490 of 4,000 jobs for one of
// four collectors with FNV chained).
uint64_t score(const std::string& collector, const std::string& job) {
  uint64_t z = fnv(collector) ^ (fnv(job) * 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Notes are read back from this far before the last read: the collectors' clocks may differ by
// this much (NTP keeps them within milliseconds; a minute is the margin for a bad one), and a note
// already acted on is recognized by its time, so reading one twice costs nothing.
constexpr uint64_t kClockSkewNs = 60'000'000'000ull;
// At most this many jobs remembered with their last note: a job silent for long is forgotten (its
// next note is acted on anyway; at worst one round more).
constexpr size_t kMaxNotedJobs = 100'000;

}  // namespace

JobSharing::JobSharing(store::Ledger& store, std::mutex& store_mu, std::string self, std::ostream& log)
    : store_(store), store_mu_(store_mu), self_(std::move(self)), log_(log) {}

std::string JobSharing::owner(const std::string& job, const std::vector<std::string>& live) {
  std::string best;
  uint64_t best_score = 0;
  for (const auto& c : live) {
    uint64_t sc = score(c, job);
    if (best.empty() || sc > best_score || (sc == best_score && c < best)) {
      best = c;
      best_score = sc;
    }
  }
  return best;
}

void JobSharing::heartbeat(uint64_t now_ns) {
  if (!store_.shared()) return;
  std::lock_guard lock(store_mu_);
  if (auto live = store_.live_collectors(self_, now_ns, kTtlNs); !live && errors_logged_++ % 100 == 0)
    log_ << "strata: serve: sharing jobs with other collectors: " << live.error().message << "\n";
}

std::set<std::string> JobSharing::take(const std::set<std::string>& seen, uint64_t now_ns) {
  if (!store_.shared()) return seen;
  std::lock_guard lock(store_mu_);
  auto complain = [&](const std::string& what) {
    // Once, then every hundredth time: a store that is away for long does not flood the log.
    if (errors_logged_++ % 100 == 0) log_ << "strata: serve: sharing jobs with other collectors: " << what << "\n";
  };
  auto live = store_.live_collectors(self_, now_ns, kTtlNs);
  if (!live) {
    // Without the others' heartbeats, diagnose what came here rather than nothing.
    complain(live.error().message);
    return seen;
  }
  std::set<std::string> mine;
  std::vector<std::string> theirs;
  for (const auto& job : seen) {
    if (owner(job, *live) == self_) {
      mine.insert(job);
    } else {
      theirs.push_back(job);
    }
  }
  handed_over_ += theirs.size();
  if (auto st = store_.note_jobs(theirs, now_ns); !st) complain(st.error().message);
  auto notes = store_.noted_jobs(notes_since_ns_ > kClockSkewNs ? notes_since_ns_ - kClockSkewNs : 0);
  if (!notes) {
    complain(notes.error().message);
    return mine;
  }
  notes_since_ns_ = now_ns;
  if (noted_.size() > kMaxNotedJobs) noted_.clear();
  for (const auto& [job, at] : *notes) {
    auto& last = noted_[job];
    if (at <= last) continue;
    last = at;
    if (owner(job, *live) == self_) mine.insert(job);
  }
  return mine;
}

}  // namespace strata::server
