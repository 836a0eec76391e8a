// Applies decoded ingest batches to the collector's store: exactly once per (agent, batch id), in
// one transaction with the bookkeeping, agent-local recording and stack ids mapped to the store's.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <unordered_map>

#include "common/result.h"
#include "ingest.pb.h"
#include "store/store.h"

namespace strata::server {

struct ApplyOutcome {
  bool duplicate = false;               // applied before: nothing written but the heartbeat
  std::map<std::string, uint64_t> rows;  // rows written per kind
  uint64_t lost_refs = 0;               // references to stacks/recordings the agent never delivered
};

// Checks what decode_batch cannot: enums in range, sizes sane. A batch that fails is refused
// whole (HTTP 400) before the store is touched.
Status validate_batch(const ingest::Batch& b);

// How many agent-id mappings the applier caches, all agents together, and per agent. Each entry is
// ~40 bytes (an unordered_map node): 2M are ~80 MB. An agent's own stack dictionary starts over at
// 200k stacks (BatchingWriter) and numbers the stacks it sends again anew, so its newest 400k
// mappings cover what it still refers to; older ones are found in the store when asked for.
inline constexpr size_t kMaxCachedAgentIds = 2'000'000;
inline constexpr size_t kMaxCachedIdsPerAgent = 400'000;

// How many batches one transaction takes at most (IngestApplier::apply_group), by their rows. A
// commit writes each page its rows touched once, whatever number of batches touched it: the time
// indexes (rows of every node interleave there) cost a page per row when each node's batch commits
// alone (measured: 3.4 KB written per ingested row at 1,000 nodes), and once per group together.
// 100k rows: ~170 of a 1,000-node job's 10 s batches, a transaction of well under a second here,
// which every batch in it waits for.
inline constexpr uint64_t kMaxGroupRows = 100'000;

// Rows in a batch, all kinds together (what kMaxGroupRows counts).
uint64_t batch_rows(const ingest::Batch& b);

class IngestApplier {
 public:
  // One batch of a group (apply_group): what to apply, and once `done`, its outcome.
  struct GroupItem {
    const ingest::Batch* batch = nullptr;
    const std::string* health_json = nullptr;
    uint64_t now_ns = 0;
    Result<ApplyOutcome> out = Error{"not applied"};
    bool done = false;
  };

  // `rows` takes the batches' rows, `ledger` what was applied and the agents' id mappings; both
  // are one store (a batch's rows and its mark land in one transaction where the store has them).
  IngestApplier(store::Writer& rows, store::Ledger& ledger, size_t max_cached_ids = kMaxCachedAgentIds,
                size_t max_per_agent = kMaxCachedIdsPerAgent)
      : rows_(rows), ledger_(ledger), max_cached_(max_cached_ids), max_per_agent_(max_per_agent) {}
  explicit IngestApplier(store::Store& store, size_t max_cached_ids = kMaxCachedAgentIds,
                         size_t max_per_agent = kMaxCachedIdsPerAgent)
      : IngestApplier(store, store, max_cached_ids, max_per_agent) {}
  // Not thread safe: the server serializes calls.
  Result<ApplyOutcome> apply(const ingest::Batch& b, const std::string& health_json, uint64_t now_ns);
  // Applies several batches in one transaction, each still exactly once and with its own outcome
  // (a duplicate is one, as in apply). When the group fails, each of its batches is applied again
  // in a transaction of its own, so a batch the store refuses fails alone. Sets every item's `out`
  // and `done`.
  void apply_group(std::span<GroupItem* const> items);
  // Mappings cached now, all agents together (bounded by max_cached_ids).
  size_t cached_ids() const { return cached_; }
  size_t cached_agents() const { return agents_.size(); }

 private:
  struct AgentMaps {
    std::unordered_map<int64_t, int64_t> recordings;
    std::unordered_map<int64_t, int64_t> stacks;
    uint64_t used = 0;  // when last used (the applier's batch count)
    size_t size() const { return recordings.size() + stacks.size(); }
  };
  // The store's id for an agent-local one: the batch's own new ones, the cache, then the store.
  Result<std::optional<int64_t>> lookup(const std::string& agent, store::AgentIdKind kind, AgentMaps& m,
                                        AgentMaps& added, int64_t local);
  void remember(AgentMaps& m, const AgentMaps& added);
  void evict_to_budget(const std::string& keep);
  Result<AgentMaps*> maps_for(const std::string& agent);
  Result<int64_t> recording(const ingest::Batch& b, AgentMaps& m, AgentMaps& added, int64_t local, ApplyOutcome& o);
  Result<int64_t> stack(const ingest::Batch& b, AgentMaps& m, AgentMaps& added, int64_t local, ApplyOutcome& o);
  Status apply_records(const ingest::Batch& b, AgentMaps& m, AgentMaps& added, ApplyOutcome& o);
  // The items in one transaction; their outcomes are set only when it commits.
  Status apply_together(std::span<GroupItem* const> items);

  store::Writer& rows_;
  store::Ledger& ledger_;
  // The newest mappings of each agent seen lately, loaded from the store on its first batch after a
  // start; bounded (max_cached_, max_per_agent_): the agent used least lately is forgotten first.
  std::unordered_map<std::string, AgentMaps> agents_;
  size_t max_cached_, max_per_agent_;
  size_t cached_ = 0;
  uint64_t batches_ = 0;
};

}  // namespace strata::server
