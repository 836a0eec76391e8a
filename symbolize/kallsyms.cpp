#include <cctype>
#include <cerrno>
#include <fstream>
#include <mutex>
#include <string_view>
#include <sstream>

#include "symbolize/symbol_table.h"
#include "symbolize/symbolizer.h"

namespace strata::symbolize {

namespace {

// kallsyms has no sizes: a symbol runs to the next one. No kernel function is near this long, so
// addresses past the last symbol of a region (kernel text, each module) stay unresolved.
constexpr uint64_t kMaxKernelSymbolSpan = 1 << 20;

bool parse_hex(const std::string& s, uint64_t& out) {
  if (s.empty() || s.size() > 16) return false;
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F')
      d = c - 'A' + 10;
    else
      return false;
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  out = v;
  return true;
}

class KallsymsTable final : public Kallsyms {
 public:
  explicit KallsymsTable(SymbolTable table) : table_(std::move(table)) {}
  std::optional<Symbol> lookup(uint64_t address) const override {
    const SymbolTable::Entry* e = table_.find(address);
    if (e == nullptr) return std::nullopt;
    Symbol s;
    s.function = std::string(table_.name(*e));
    return s;
  }
  size_t symbol_count() const override { return table_.size(); }
  std::optional<std::pair<uint64_t, uint64_t>> range_of(std::string_view function) const override {
    for (const auto& e : table_.entries()) {
      if (table_.name(e) == function) return std::pair{e.start, e.end};
    }
    return std::nullopt;
  }

 private:
  SymbolTable table_;
};

}  // namespace

std::shared_ptr<const Kallsyms> Kallsyms::shared() {
  static std::mutex mu;
  static bool tried = false;
  static std::shared_ptr<const Kallsyms> table;
  std::lock_guard<std::mutex> lock(mu);
  if (!tried) {
    tried = true;
    if (auto k = load()) table = std::move(*k);
  }
  return table;
}

Result<std::unique_ptr<Kallsyms>> Kallsyms::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error::from_errno("cannot open " + path, errno);
  // Read it whole, then split in place: ~200k lines, parsed without a stream per line.
  std::string text;
  {
    char buf[1 << 16];
    while (in.read(buf, sizeof buf) || in.gcount() > 0) text.append(buf, static_cast<size_t>(in.gcount()));
  }
  SymbolTable table;
  size_t text_symbols = 0;
  size_t nonzero = 0;
  std::string_view all(text);
  auto next_field = [](std::string_view& line) {
    size_t b = line.find_first_not_of(" \t");
    if (b == std::string_view::npos) {
      line = {};
      return std::string_view{};
    }
    line.remove_prefix(b);
    size_t e = line.find_first_of(" \t");
    std::string_view f = line.substr(0, e);
    line.remove_prefix(e == std::string_view::npos ? line.size() : e);
    return f;
  };
  while (!all.empty()) {
    size_t eol = all.find('\n');
    std::string_view line = all.substr(0, eol);
    all.remove_prefix(eol == std::string_view::npos ? all.size() : eol + 1);
    // "ffffffff81000000 T _stext" or "ffffffffc0a01000 t helper\t[module]"
    std::string_view addr_text = next_field(line), type = next_field(line), name = next_field(line);
    if (addr_text.empty() || name.empty() || type.size() != 1) continue;
    char t = type[0];
    if (t != 't' && t != 'T' && t != 'w' && t != 'W') continue;
    uint64_t addr = 0;
    if (!parse_hex(std::string(addr_text), addr)) continue;
    ++text_symbols;
    if (addr == 0) continue;
    ++nonzero;
    uint64_t limit = addr + kMaxKernelSymbolSpan < addr ? UINT64_MAX : addr + kMaxKernelSymbolSpan;
    table.add(addr, 0, limit, t == 'T' ? 0 : 1, std::string(name));
  }
  if (in.bad()) return Error::from_errno("reading " + path, errno);
  if (text_symbols == 0) return Error{path + ": no kernel text symbols (not a kallsyms file?)"};
  if (nonzero == 0) {
    return Error{path +
                 ": all symbol addresses are zero: kernel.kptr_restrict hides them "
                 "(run as root with CAP_SYSLOG, or set kernel.kptr_restrict=0)"};
  }
  table.finish();
  return std::unique_ptr<Kallsyms>(std::make_unique<KallsymsTable>(std::move(table)));
}

std::optional<Symbol> lookup_perf_map_file(const std::string& path, uint64_t addr) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string line;
  // Later lines win: a JIT reusing an address range appends the new code's line.
  std::optional<Symbol> found;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string start_text, size_text;
    if (!(fields >> start_text >> size_text)) continue;
    std::string name;
    std::getline(fields >> std::ws, name);  // names may contain spaces
    while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
    uint64_t start = 0, size = 0;
    auto strip0x = [](std::string& s) {
      if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) s = s.substr(2);
    };
    strip0x(start_text);
    strip0x(size_text);
    if (!parse_hex(start_text, start) || !parse_hex(size_text, size) || name.empty()) continue;
    if (addr >= start && addr - start < size) found = Symbol{name, "", 0};
  }
  return found;
}

std::optional<Symbol> lookup_perf_map(int pid, uint64_t addr) {
  return lookup_perf_map_file("/tmp/perf-" + std::to_string(pid) + ".map", addr);
}

}  // namespace strata::symbolize
