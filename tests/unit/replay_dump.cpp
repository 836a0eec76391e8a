#include "tests/unit/replay_dump.h"

#include <sqlite3.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>
#include <vector>

namespace strata::test {
namespace {

// The metrics replay makes: the GPU/comm source's (agent/gpu_comm_source.cpp) and the OS layer's
// (agent/os/os_metrics.h: os.* and net.*). NVML's gpu.* and the agent's own agent.* are not replayed.
const char* kReplayedMetrics =
    "(name IN ('gpu.kernel_count','gpu.kernel_us','api.calls','api.time_us','gpu.device') OR name LIKE 'os.%' OR "
    "name LIKE 'net.%')";

struct Db {
  sqlite3* db = nullptr;
  ~Db() { sqlite3_close(db); }
};

// Runs `sql` and appends each row as "prefix|col|col...". A column named in `stack_cols` (by
// index) is a stack id and is written as its frames.
class Dumper {
 public:
  explicit Dumper(sqlite3* db) : db_(db) {}

  Status load_frames() {
    std::vector<std::vector<std::string>> rows;
    if (auto st = query("SELECT id, kind, build_id, module, offset FROM frames", rows); !st) return st;
    for (const auto& r : rows) frames_[std::stoll(r[0])] = r[1] + ":" + r[2] + ":" + r[3] + "+" + r[4];
    rows.clear();
    if (auto st = query("SELECT id, method, hex(frames) FROM stacks", rows); !st) return st;
    for (const auto& r : rows) {
      std::string text = "m" + r[1];
      const std::string& hex = r[2];
      for (size_t i = 0; i + 16 <= hex.size(); i += 16) {
        uint64_t v = 0;
        for (int b = 7; b >= 0; --b) v = (v << 8) | std::stoul(hex.substr(i + static_cast<size_t>(b) * 2, 2), nullptr, 16);
        auto it = frames_.find(static_cast<int64_t>(v));
        text += ";" + (it != frames_.end() ? it->second : std::string("?"));
      }
      stacks_[std::stoll(r[0])] = text;
    }
    rows.clear();
    if (auto st = query("SELECT id FROM windows ORDER BY start_ns, id", rows); !st) return st;
    for (size_t i = 0; i < rows.size(); ++i) windows_[std::stoll(rows[i][0])] = std::to_string(i);
    return {};
  }

  Status section(const std::string& name, const std::string& sql, std::vector<int> stack_cols = {},
                 std::vector<int> window_cols = {}) {
    std::vector<std::vector<std::string>> rows;
    if (auto st = query(sql, rows); !st) return st;
    std::vector<std::string> lines;
    for (auto& r : rows) {
      for (int c : stack_cols) r[static_cast<size_t>(c)] = stack(r[static_cast<size_t>(c)]);
      for (int c : window_cols) {
        auto it = windows_.find(std::stoll(r[static_cast<size_t>(c)]));
        r[static_cast<size_t>(c)] = it != windows_.end() ? "w" + it->second : "w?";
      }
      std::string line = name;
      for (const auto& v : r) line += "|" + v;
      lines.push_back(line);
    }
    std::sort(lines.begin(), lines.end());
    out_ << "# " << name << " " << lines.size() << "\n";
    for (const auto& l : lines) out_ << l << "\n";
    return {};
  }

  std::string text() const { return out_.str(); }

 private:
  std::string stack(const std::string& id) const {
    auto it = stacks_.find(std::stoll(id));
    return it != stacks_.end() ? it->second : "?";
  }

  Status query(const std::string& sql, std::vector<std::vector<std::string>>& rows) {
    sqlite3_stmt* s = nullptr;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &s, nullptr) != SQLITE_OK)
      return Error{std::string("query: ") + sqlite3_errmsg(db_)};
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
      std::vector<std::string> r;
      for (int i = 0; i < sqlite3_column_count(s); ++i) {
        const unsigned char* t = sqlite3_column_text(s, i);
        r.emplace_back(t ? reinterpret_cast<const char*>(t) : "NULL");
      }
      rows.push_back(std::move(r));
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE) return Error{std::string("query: ") + sqlite3_errmsg(db_)};
    return {};
  }

  sqlite3* db_;
  std::map<int64_t, std::string> frames_, stacks_, windows_;
  std::ostringstream out_;
};

}  // namespace

Result<std::string> replay_dump(const std::string& db_path) {
  Db db;
  if (sqlite3_open_v2(db_path.c_str(), &db.db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK)
    return Error{"cannot open " + db_path};
  Dumper d(db.db);
  if (auto st = d.load_frames(); !st) return st.error();
  // Float columns through printf: the same text wherever the test runs.
  Status st = d.section("recording", "SELECT node, command, started_ns, ended_ns, sample_hz, printf('%.3f', window_s) FROM recordings");
  if (st) st = d.section("process", "SELECT pid, ppid, start_ns, comm, command, job, rank, local_rank, world_size FROM processes");
  if (st) st = d.section("window", "SELECT start_ns, end_ns FROM windows");
  if (st) st = d.section("stack_count", "SELECT window_id, kind, pid, tid, thread_comm, stack_id, value FROM stack_counts", {5}, {0});
  if (st) st = d.section("communicator", "SELECT pid, handle, comm_id, rank, nranks, init_ns FROM communicators");
  if (st) st = d.section("collective",
                         "SELECT pid, tid, library, op, comm_id, comm_handle, seq, count, dtype, bytes, redop, peer, stream, "
                         "enter_ns, exit_ns, device_start_ns, device_end_ns, completion, ret FROM collectives");
  if (st) st = d.section("step",
                         "SELECT pid, step, start_ns, end_ns, collective_ns, device_collective_ns, device_compute_ns, "
                         "gpu_idle_ns, device_known FROM steps");
  if (st) st = d.section("device",
                         "SELECT pid, device, kind, name, stream, start_ns, end_ns, api_ns, api_tid, correlation, bytes "
                         "FROM device_activity");
  if (st) st = d.section("launch", "SELECT start_ns, end_ns, pid, tid, kernel, stack_id, count FROM launch_samples", {5});
  if (st) st = d.section("metric",
                         std::string("SELECT start_ns, end_ns, pid, name, label, printf('%.3f', value) FROM metrics WHERE ") +
                             kReplayedMetrics);
  if (!st) return st.error();
  return d.text();
}

}  // namespace strata::test
