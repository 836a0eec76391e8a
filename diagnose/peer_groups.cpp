#include "diagnose/peer_groups.h"

#include <map>
#include <numeric>
#include <set>

namespace strata::diagnose {

namespace {

struct UnionFind {
  std::vector<size_t> up;
  explicit UnionFind(size_t n) : up(n) { std::iota(up.begin(), up.end(), size_t{0}); }
  size_t find(size_t x) {
    while (up[x] != x) x = up[x] = up[up[x]];
    return x;
  }
  void join(size_t a, size_t b) { up[find(a)] = find(b); }
};

}  // namespace

std::vector<int> peer_groups(size_t n, const std::vector<CommMembership>& members, const CommTraffic& traffic) {
  // Who holds which position of each communicator, and each communicator's members.
  std::map<std::pair<std::string, int>, size_t> at;
  std::map<std::string, std::set<size_t>> member_set;
  std::map<std::string, std::set<size_t>> unplaced;  // rank indices follow rank order
  for (const auto& m : members) {
    if (m.comm_id.empty() || m.rank >= n) continue;
    if (m.position < 0) unplaced[m.comm_id].insert(m.rank);
    else at[{m.comm_id, m.position}] = m.rank;
    member_set[m.comm_id].insert(m.rank);
  }
  for (const auto& [id, set] : unplaced) {
    int pos = 0;
    for (size_t r : set) at[{id, pos++}] = r;
  }
  // Point-to-point links between ranks (either direction).
  std::set<std::pair<size_t, size_t>> linked;
  for (const auto& p : traffic.p2p) {
    auto it = at.find({p.comm_id, p.peer});
    if (p.rank >= n || it == at.end() || it->second == p.rank) continue;
    linked.insert({std::min(p.rank, it->second), std::max(p.rank, it->second)});
  }
  if (linked.empty()) return {};  // no pipeline seen: every rank is a peer

  // A communicator is symmetric only when no two of its members hand work to each other. Checked
  // per link through the (few) communicators of one end: linear in links, not in members squared.
  std::map<size_t, std::vector<const std::string*>> comms_of;
  for (const auto& [id, set] : member_set) {
    for (size_t r : set) comms_of[r].push_back(&id);
  }
  std::set<std::string> spans_link;
  for (const auto& [a, b] : linked) {
    for (const std::string* id : comms_of[a]) {
      if (member_set[*id].count(b)) spans_link.insert(*id);
    }
  }
  UnionFind uf(n);
  for (const auto& id : traffic.collective_comms) {
    auto ms = member_set.find(id);
    if (ms == member_set.end() || spans_link.count(id)) continue;
    for (size_t r : ms->second) uf.join(r, *ms->second.begin());
  }
  // Groups numbered by their lowest rank index, in order.
  std::vector<int> group(n, -1);
  std::map<size_t, int> label;
  for (size_t i = 0; i < n; ++i) {
    auto [it, fresh] = label.emplace(uf.find(i), static_cast<int>(label.size()));
    group[i] = it->second;
  }
  return group;
}

std::vector<int> peer_groups(size_t n, const ProcIndex& index, const std::vector<store::CommunicatorRecord>& comms,
                             std::span<const store::CollectiveRecord> calls) {
  const IndexOf index_of = [&](std::string_view node, uint32_t pid) -> std::optional<size_t> {
    auto it = index.find({std::string(node), pid});
    if (it == index.end()) return std::nullopt;
    return it->second;
  };
  return peer_groups(n, index_of, comms, calls);
}

std::vector<int> peer_groups(size_t n, const IndexOf& index_of, const std::vector<store::CommunicatorRecord>& comms,
                             std::span<const store::CollectiveRecord> calls) {
  CommTraffic traffic;
  std::set<std::string> collective_comms;
  const std::string* last_comm = nullptr;  // calls come in time order: runs of one communicator
  for (const auto& c : calls) {
    if (c.comm_id.empty()) continue;
    auto at = index_of(c.node, c.pid);
    if (!at) continue;
    if (c.op == "send" || c.op == "recv") traffic.p2p.push_back({*at, c.comm_id, c.peer});
    else if (!last_comm || *last_comm != c.comm_id) last_comm = &*collective_comms.insert(c.comm_id).first;
  }
  traffic.collective_comms.assign(collective_comms.begin(), collective_comms.end());
  std::vector<CommMembership> members;
  for (const auto& c : comms) {
    if (auto at = index_of(c.node, c.pid)) members.push_back({*at, c.comm_id, c.rank, c.nranks});
  }
  return peer_groups(n, members, traffic);
}

}  // namespace strata::diagnose
