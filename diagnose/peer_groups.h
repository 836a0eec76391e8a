// Peers by parallel role (DESIGN §6 step 2): which ranks do the same work and so may be compared.
//
// In a data-parallel job every rank does the same work. In a pipeline-parallel job the stages do
// different work by design (other layers, the output head), so a rank is compared only with the
// ranks of its own stage: its tensor-parallel siblings (equal shards of the same layers) and its
// data-parallel replicas. What says which ranks share a stage is the communicators the job made
// (ncclCommInitRank*, recorded with each rank's position and the communicator's size) and what it
// does on them:
//   - a point-to-point link (ncclSend/ncclRecv between two ranks) joins ranks that hand work on to
//     each other: pipeline neighbours, which differ by design;
//   - a communicator that carries collectives (all-reduce, all-gather, reduce-scatter, ...) among
//     ranks none of which are linked point-to-point is a group of symmetric members (the TP group
//     of a stage, the DP group of a stage's shard): its members do the same work.
// Peers are the connected components of "share such a symmetric communicator". A communicator
// that spans linked ranks (the world's, used for a gradient-norm all-reduce across stages) says
// nothing about roles and is ignored. A rank that shares no symmetric communicator with anyone
// (a stage of one rank) has no peers: it is compared with nobody, only with its own past.
//
// Without any point-to-point link (no pipeline seen, or no membership recorded: gloo jobs, whose
// group creation the agent does not see, and communicators made before the agent attached), every
// rank does the same work as far as is known: all ranks are peers, as before.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "store/store.h"

namespace strata::diagnose {

// One rank's place in one communicator.
struct CommMembership {
  size_t rank = 0;      // index into JobWindow::ranks
  std::string comm_id;  // the same on every member
  // Its rank in the communicator; -1 when the call did not say (ncclCommSplit: NCCL orders the
  // members by the split key, then the parent rank, and PyTorch's key is the parent rank, so the
  // members of unknown position are placed in rank order).
  int position = -1;
  int size = 0;
};

struct CommTraffic {
  std::vector<std::string> collective_comms;  // communicators that carried a collective (not send/recv)
  // Point-to-point calls: the caller (rank index), the communicator and the peer's position in it.
  struct P2p {
    size_t rank = 0;
    std::string comm_id;
    int peer = -1;
  };
  std::vector<P2p> p2p;
};

// The peer group of every rank (n of them, indices as in `members`): ranks with the same value do
// the same work. Empty when roles are unknown (no point-to-point link): every rank is a peer.
std::vector<int> peer_groups(size_t n, const std::vector<CommMembership>& members, const CommTraffic& traffic);

// The same from what the store recorded: `index` gives each rank's process its rank index
// ((node, pid) -> 0..n-1; a rank restarted under a new pid has both); communicators and calls of
// other processes are ignored. The diagnosis and the web API's heatmap both group ranks this way.
using ProcIndex = std::map<std::pair<std::string, uint32_t>, size_t>;
std::vector<int> peer_groups(size_t n, const ProcIndex& index, const std::vector<store::CommunicatorRecord>& comms,
                             std::span<const store::CollectiveRecord> calls);
// The same with the lookup given: a process's rank index, nullopt when it is no rank's. The loader
// passes its own index of the ranks, looked up by views (a call row each, millions in a round).
using IndexOf = std::function<std::optional<size_t>(std::string_view node, uint32_t pid)>;
std::vector<int> peer_groups(size_t n, const IndexOf& index_of, const std::vector<store::CommunicatorRecord>& comms,
                             std::span<const store::CollectiveRecord> calls);

}  // namespace strata::diagnose
