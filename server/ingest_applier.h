// Applies decoded ingest batches to the collector's store: exactly once per (agent, batch id), in
// one transaction with the bookkeeping, agent-local recording and stack ids mapped to the store's.
#pragma once

#include <cstdint>
#include <map>
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

class IngestApplier {
 public:
  explicit IngestApplier(store::Store& store) : store_(store) {}
  // Not thread safe: the server serializes calls.
  Result<ApplyOutcome> apply(const ingest::Batch& b, const std::string& health_json, uint64_t now_ns);

 private:
  struct AgentMaps {
    std::unordered_map<int64_t, int64_t> recordings;
    std::unordered_map<int64_t, int64_t> stacks;
  };
  Result<AgentMaps*> maps_for(const std::string& agent);
  Result<int64_t> recording(const ingest::Batch& b, AgentMaps& m, AgentMaps& added, int64_t local, ApplyOutcome& o);
  Result<int64_t> stack(const ingest::Batch& b, AgentMaps& m, AgentMaps& added, int64_t local, ApplyOutcome& o);
  Status apply_records(const ingest::Batch& b, AgentMaps& m, AgentMaps& added, ApplyOutcome& o);

  store::Store& store_;
  // Loaded from the store on an agent's first batch after a start; bounded by agents x their
  // dictionaries (each agent caps its own).
  std::unordered_map<std::string, AgentMaps> agents_;
};

}  // namespace strata::server
