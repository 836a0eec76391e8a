#include "symbolize/symbol_table.h"

#include <algorithm>
#include <limits>

namespace strata::symbolize {

namespace {
constexpr uint64_t kMaxArena = std::numeric_limits<uint32_t>::max();
// How far back find() looks for a symbol that encloses a smaller one starting after it.
constexpr int kNestedLookback = 8;
}  // namespace

void SymbolTable::add(uint64_t start, uint64_t size, uint64_t limit, int rank, std::string_view name) {
  if (name.empty() || arena_.size() + name.size() > kMaxArena) return;
  pending_.push_back(Pending{start, size, limit, rank, static_cast<uint32_t>(arena_.size()),
                             static_cast<uint32_t>(name.size())});
  arena_.append(name);
}

void SymbolTable::finish() {
  auto pending_name = [this](const Pending& p) {
    return std::string_view(arena_).substr(p.name_offset, p.name_size);
  };
  // Per address: sized symbols first (they carry real extents), then by rank, then by name so the
  // choice does not depend on the file's symbol order.
  std::sort(pending_.begin(), pending_.end(), [&](const Pending& a, const Pending& b) {
    if (a.start != b.start) return a.start < b.start;
    if ((a.size == 0) != (b.size == 0)) return a.size != 0;
    if (a.rank != b.rank) return a.rank < b.rank;
    return pending_name(a) < pending_name(b);
  });
  pending_.erase(std::unique(pending_.begin(), pending_.end(),
                             [](const Pending& a, const Pending& b) { return a.start == b.start; }),
                 pending_.end());

  std::string arena;
  entries_.clear();
  entries_.reserve(pending_.size());
  for (size_t i = 0; i < pending_.size(); ++i) {
    const Pending& p = pending_[i];
    uint64_t end;
    if (p.size != 0) {
      end = p.start + p.size < p.start ? std::numeric_limits<uint64_t>::max() : p.start + p.size;
    } else {
      end = i + 1 < pending_.size() ? pending_[i + 1].start : std::numeric_limits<uint64_t>::max();
      end = std::min(end, p.limit);
    }
    if (end <= p.start) continue;  // a zero-size symbol at its section's end covers nothing
    std::string_view name = pending_name(p);
    entries_.push_back(
        Entry{p.start, end, static_cast<uint32_t>(arena.size()), static_cast<uint32_t>(name.size())});
    arena.append(name);
  }
  arena.shrink_to_fit();
  arena_ = std::move(arena);
  entries_.shrink_to_fit();
  pending_ = {};
}

const SymbolTable::Entry* SymbolTable::find(uint64_t address) const {
  auto it = std::upper_bound(entries_.begin(), entries_.end(), address,
                             [](uint64_t a, const Entry& e) { return a < e.start; });
  for (int i = 0; i < kNestedLookback && it != entries_.begin(); ++i) {
    --it;
    if (address < it->end) return &*it;
  }
  return nullptr;
}

}  // namespace strata::symbolize
