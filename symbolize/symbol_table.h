// A sorted table of address ranges → names, with all names in one string arena: what ELF and
// kernel lookups need and nothing more (24 bytes a symbol plus its name).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace strata::symbolize {

class SymbolTable {
 public:
  struct Entry {
    uint64_t start = 0;
    uint64_t end = 0;  // exclusive
    uint32_t name_offset = 0;
    uint32_t name_size = 0;
  };

  // size 0: the symbol covers up to the next symbol's start, but never past limit (its section's
  // end). Among symbols at one address the lowest rank wins (e.g. global before local).
  void add(uint64_t start, uint64_t size, uint64_t limit, int rank, std::string_view name);
  // Sorts, drops aliases, sizes the zero-size symbols and compacts the arena. Call once after the
  // last add.
  void finish();

  const Entry* find(uint64_t address) const;
  std::string_view name(const Entry& e) const {
    return std::string_view(arena_).substr(e.name_offset, e.name_size);
  }
  size_t size() const { return entries_.size(); }
  const std::vector<Entry>& entries() const { return entries_; }

 private:
  struct Pending {
    uint64_t start;
    uint64_t size;
    uint64_t limit;
    int rank;
    uint32_t name_offset;
    uint32_t name_size;
  };
  std::vector<Pending> pending_;
  std::vector<Entry> entries_;
  std::string arena_;
};

}  // namespace strata::symbolize
