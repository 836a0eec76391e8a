// The embedded store: one SQLite file in WAL mode. Foreign, corrupt or newer files are refused
// before anything is written to them.
#include <sqlite3.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <unordered_map>

#include "store/catalog.h"
#include "store/store.h"

namespace strata::store {
namespace {

// A string as an SQL literal, quoted by SQLite itself (%Q): for a clause built as text.
std::string sql_text(const std::string& v) {
  char* q = sqlite3_mprintf("%Q", v.c_str());
  std::string out = q ? q : "''";
  sqlite3_free(q);
  return out;
}

// Id caches in front of the frames and stacks tables. A long-running writer (`strata agent` with a
// local file, `strata serve`) meets new stacks forever: past these sizes a cache starts over, and
// the unique indexes answer the lookups it no longer can. ~150 bytes a frame entry, ~400 bytes a
// stack entry (its frame ids): ~35 MB at most.
constexpr size_t kMaxCachedFrameIds = 1u << 17;
constexpr size_t kMaxCachedStackIds = 1u << 15;

const char* kSchema = R"sql(
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE recordings(
  id INTEGER PRIMARY KEY, node TEXT NOT NULL, command TEXT NOT NULL, started_ns INTEGER NOT NULL,
  ended_ns INTEGER, sample_hz INTEGER NOT NULL, window_s REAL NOT NULL);
CREATE TABLE processes(
  id INTEGER PRIMARY KEY, recording_id INTEGER NOT NULL REFERENCES recordings(id), node TEXT NOT NULL,
  pid INTEGER NOT NULL, ppid INTEGER NOT NULL, start_ns INTEGER NOT NULL, comm TEXT NOT NULL,
  command TEXT NOT NULL, job TEXT NOT NULL, rank INTEGER NOT NULL, local_rank INTEGER NOT NULL,
  world_size INTEGER NOT NULL, UNIQUE(recording_id, node, pid, start_ns));
CREATE TABLE frames(
  id INTEGER PRIMARY KEY, kind INTEGER NOT NULL, build_id TEXT NOT NULL, module TEXT NOT NULL,
  offset INTEGER NOT NULL, function TEXT, file TEXT, line INTEGER,
  UNIQUE(kind, build_id, module, offset));
CREATE TABLE stacks(id INTEGER PRIMARY KEY, hash INTEGER NOT NULL, method INTEGER NOT NULL, frames BLOB NOT NULL);
CREATE INDEX stacks_by_hash ON stacks(hash);
CREATE TABLE windows(
  id INTEGER PRIMARY KEY, recording_id INTEGER NOT NULL REFERENCES recordings(id),
  start_ns INTEGER NOT NULL, end_ns INTEGER NOT NULL);
CREATE TABLE stack_counts(
  window_id INTEGER NOT NULL REFERENCES windows(id), recording_id INTEGER NOT NULL, kind INTEGER NOT NULL,
  pid INTEGER NOT NULL, tid INTEGER NOT NULL, thread_comm TEXT NOT NULL,
  stack_id INTEGER NOT NULL REFERENCES stacks(id), value INTEGER NOT NULL);
CREATE TABLE agent_stats(
  recording_id INTEGER NOT NULL, key TEXT NOT NULL, value REAL NOT NULL, PRIMARY KEY(recording_id, key));
)sql";

// Schema 2: what `strata serve` keeps about the agents that ship to it.
const char* kCollectorSchema = R"sql(
CREATE TABLE IF NOT EXISTS ingest_batches(
  agent_id TEXT NOT NULL, batch_id INTEGER NOT NULL, received_ns INTEGER NOT NULL, PRIMARY KEY(agent_id, batch_id));
CREATE TABLE IF NOT EXISTS agent_ids(
  agent_id TEXT NOT NULL, kind INTEGER NOT NULL, local_id INTEGER NOT NULL, store_id INTEGER NOT NULL,
  PRIMARY KEY(agent_id, kind, local_id));
CREATE TABLE IF NOT EXISTS agents(
  agent_id TEXT PRIMARY KEY, node TEXT NOT NULL, last_seen_ns INTEGER NOT NULL, last_batch INTEGER NOT NULL,
  interval_s REAL NOT NULL, health TEXT NOT NULL);
)sql";

// Schema 3: the diagnoses `strata serve` makes every window. The latest round per job, and every
// round's findings (their history: when one first appeared, whether it is still there).
const char* kDiagnosisSchema = R"sql(
CREATE TABLE IF NOT EXISTS diagnoses(
  job TEXT PRIMARY KEY, diagnosed_ns INTEGER NOT NULL, window_start_ns INTEGER NOT NULL,
  window_end_ns INTEGER NOT NULL, ranks INTEGER NOT NULL, findings INTEGER NOT NULL,
  report_json TEXT NOT NULL, report_text TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS findings(
  job TEXT NOT NULL, diagnosed_ns INTEGER NOT NULL, window_start_ns INTEGER NOT NULL,
  window_end_ns INTEGER NOT NULL, rank INTEGER NOT NULL, node TEXT NOT NULL, layer TEXT NOT NULL,
  cause TEXT NOT NULL, culprit TEXT NOT NULL, lost_ms_per_step REAL NOT NULL, confidence REAL NOT NULL,
  evidence TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS findings_by_job ON findings(job, rank, cause, diagnosed_ns);
)sql";

// Indexes on the end time of each time table's rows: a bounded read (RowQuery, a profile's
// windows) wants the rows that end after its start, and the latest stretch (the diagnosis rounds,
// `strata diagnose`) is then exactly what the index range holds, whatever the file holds before it
// (an index on the start would have to reach back by the longest row, kMaxRowSpanNs). Retention
// deletes by the same index. Stack counts are found by window and process (the diagnosis reads one
// process's windows of a span). A collective's end is the expression the reads use. A node's
// recordings are found by the node (one node's profile: a hang's stall stacks are read node by node,
// and a scan of every recording per node grew with every job the file ever held). Added to older
// files when they are opened for writing (once; minutes for a large file).
const char* kTimeIndexes = R"sql(
CREATE INDEX IF NOT EXISTS steps_by_end ON steps(end_ns);
CREATE INDEX IF NOT EXISTS steps_by_recording_end ON steps(recording_id, end_ns);
CREATE INDEX IF NOT EXISTS metrics_by_end ON metrics(end_ns);
CREATE INDEX IF NOT EXISTS collectives_by_end ON collectives(MAX(exit_ns, enter_ns + 1));
CREATE INDEX IF NOT EXISTS device_activity_by_end ON device_activity(end_ns);
CREATE INDEX IF NOT EXISTS windows_by_end ON windows(end_ns);
CREATE INDEX IF NOT EXISTS windows_by_recording_end ON windows(recording_id, end_ns);
CREATE INDEX IF NOT EXISTS stack_counts_by_window ON stack_counts(window_id, pid);
CREATE INDEX IF NOT EXISTS launch_samples_by_end ON launch_samples(end_ns);
CREATE INDEX IF NOT EXISTS recordings_by_node ON recordings(node);
)sql";
// One process's collectives and device activity (a rank's timeline, `strata report --rank`) are
// found by the hour they began in and the process: a read seeks its process in each hour of its span
// (of the table, without one). Inserts then go to the current hour's part of the index, whose size
// does not grow with the file; an index led by the process sent each window's rows to one place per
// process all over it (scaled down by 4, 8,000 processes, a week of history: a window's collectives
// took 0.15-1.3 s to add against 0.08-0.11 s, and the same at an hour of history). The bucket is the
// longest row (kMaxRowSpanNs), so a span's rows began in its own hours or the one before.
constexpr uint64_t kPidBucketNs = kMaxRowSpanNs;
std::string pid_bucket(const std::string& start_column) {
  return start_column + " / " + std::to_string(kPidBucketNs);
}
std::string hour_pid_indexes() {
  return "CREATE INDEX IF NOT EXISTS collectives_by_hour_pid ON collectives(" + pid_bucket("enter_ns") +
         ", pid, recording_id);\n"
         "CREATE INDEX IF NOT EXISTS device_activity_by_hour_pid ON device_activity(" + pid_bucket("start_ns") +
         ", pid, recording_id);\n";
}
// Indexes that older files have and no read uses, dropped when such a file is opened for writing.
// metrics_by_name(name, recording_id): a metrics read filters names by prefix (substr, which no
// index serves) and never by name alone, so the planner never chose it, while every metric row
// written goes to its (name, recording) place: one index page per metric name and node each window.
// At 8,000 ranks the file's tail of that index outgrew the page cache as the job aged, and ingest
// read and wrote pages all over it (the collector's pread/pwrite per row grew with the file; scaled
// down by 4, a window's metrics took 0.30-0.55 s to add with it at 42 hours of history against
// 0.08-0.10 s without, and 0.12 against 0.10 at 1 hour). Metrics are two thirds of a collector's rows.
// The indexes led by the process (collectives_by_pid, device_activity_by_pid, stack_counts_by_pid)
// scattered the same way: the hour indexes above and stack_counts_by_window replace them.
const char* kUnusedIndexes = R"sql(
DROP INDEX IF EXISTS metrics_by_name;
DROP INDEX IF EXISTS collectives_by_pid;
DROP INDEX IF EXISTS device_activity_by_pid;
DROP INDEX IF EXISTS stack_counts_by_pid;
)sql";
// The same for what only a collector's file has (schema 2 and 3).
const char* kCollectorTimeIndexes = R"sql(
CREATE INDEX IF NOT EXISTS ingest_batches_by_time ON ingest_batches(received_ns);
CREATE INDEX IF NOT EXISTS findings_by_time ON findings(diagnosed_ns);
)sql";

// A prepared statement that finalizes itself.
// Rows SQLite stepped through in full-table scans, over every statement finished (sqlite_full_scan_steps).
std::atomic<uint64_t> g_full_scan_steps{0};

class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &s_, nullptr); }
  ~Stmt() {
    if (s_) g_full_scan_steps.fetch_add(static_cast<uint64_t>(sqlite3_stmt_status(s_, SQLITE_STMTSTATUS_FULLSCAN_STEP, 0)),
                                        std::memory_order_relaxed);
    sqlite3_finalize(s_);
  }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  bool ok() const { return rc_ == SQLITE_OK; }
  sqlite3_stmt* get() { return s_; }
  Stmt& bind(int i, int64_t v) { sqlite3_bind_int64(s_, i, v); return *this; }
  Stmt& bind(int i, double v) { sqlite3_bind_double(s_, i, v); return *this; }
  Stmt& bind(int i, const std::string& v) {
    sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& bind_blob(int i, const void* p, size_t n) {
    sqlite3_bind_blob(s_, i, p, static_cast<int>(n), SQLITE_TRANSIENT);
    return *this;
  }
  int step() { return sqlite3_step(s_); }
  // A statement that failed to prepare (a corrupt or foreign schema) is null: sqlite3_reset accepts
  // that, sqlite3_clear_bindings does not.
  void reset() {
    if (!s_) return;
    sqlite3_reset(s_);
    sqlite3_clear_bindings(s_);
  }
  int64_t i64(int c) { return sqlite3_column_int64(s_, c); }
  double dbl(int c) { return sqlite3_column_double(s_, c); }
  std::string text(int c) {
    auto* t = sqlite3_column_text(s_, c);
    return t ? std::string(reinterpret_cast<const char*>(t), sqlite3_column_bytes(s_, c)) : std::string();
  }
  bool is_null(int c) { return sqlite3_column_type(s_, c) == SQLITE_NULL; }
  std::string blob(int c) {
    auto* b = sqlite3_column_blob(s_, c);
    return b ? std::string(static_cast<const char*>(b), sqlite3_column_bytes(s_, c)) : std::string();
  }

 private:
  sqlite3_stmt* s_ = nullptr;
  int rc_ = SQLITE_ERROR;
};

int64_t i64(uint64_t v) { return static_cast<int64_t>(v); }
int64_t i64(uint32_t v) { return v; }
int64_t i64(int v) { return v; }

// -- the catalog's kinds (store/catalog.h) in SQLite. A kind's table is recording_id, the window's
// start_ns and end_ns for kinds counted per window (metrics, launch samples: `of_window`), and then
// its columns; rows read back add the recording's node.
template <typename Row, typename Msg, size_t N>
std::string create_table(const char* table, const catalog::Column<Row, Msg> (&columns)[N], bool of_window = false) {
  std::string s = std::string("CREATE TABLE ") + table + "(recording_id INTEGER NOT NULL";
  if (of_window) s += ", start_ns INTEGER NOT NULL, end_ns INTEGER NOT NULL";
  for (const auto& c : columns) s += std::string(", ") + c.name + " " + catalog::sqlite_type(c) + " NOT NULL";
  return s + ");\n";
}

template <typename Row, typename Msg, size_t N>
std::string insert_sql(const char* table, const catalog::Column<Row, Msg> (&columns)[N], bool of_window = false) {
  std::string names = "recording_id", params = "?";
  if (of_window) {
    names += ",start_ns,end_ns";
    params += ",?,?";
  }
  for (const auto& c : columns) {
    names += std::string(",") + c.name;
    params += ",?";
  }
  return std::string("INSERT INTO ") + table + "(" + names + ") VALUES(" + params + ")";
}

// "x.pid,x.step,...": the columns of a read of `table` (Select::sql adds the node); a column an
// older read-only file lacks (`missing`: "table.column") reads as its default.
template <typename Row, typename Msg, size_t N>
std::string select_columns(const char* table, const catalog::Column<Row, Msg> (&columns)[N],
                           const std::set<std::string>& missing) {
  std::string s;
  for (const auto& c : columns) {
    s += s.empty() ? "" : ",";
    s += missing.count(std::string(table) + "." + c.name) ? catalog::default_literal(c) : "x." + std::string(c.name);
  }
  return s;
}

// Binds a row's columns from parameter `first` on; integers as SQLite's 64-bit ones.
template <typename Row, typename Msg, size_t N>
void bind_row(Stmt& s, int first, const catalog::Column<Row, Msg> (&columns)[N], const Row& r) {
  int i = first;
  for (const auto& c : columns) {
    std::visit(
        [&](auto m) {
          using T = catalog::MemberType<Row, decltype(m)>;
          if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, double>) s.bind(i, r.*m);
          else if constexpr (std::is_same_v<T, bool>) s.bind(i, int64_t{r.*m ? 1 : 0});
          else s.bind(i, static_cast<int64_t>(r.*m));
        },
        c.member);
    ++i;
  }
}

// Reads a row's columns from result column `first` on; returns the next result column.
template <typename Row, typename Msg, size_t N>
int read_row(Stmt& s, int first, const catalog::Column<Row, Msg> (&columns)[N], Row& r) {
  int i = first;
  for (const auto& c : columns) {
    std::visit(
        [&](auto m) {
          using T = catalog::MemberType<Row, decltype(m)>;
          if constexpr (std::is_same_v<T, std::string>) r.*m = s.text(i);
          else if constexpr (std::is_same_v<T, double>) r.*m = s.dbl(i);
          else if constexpr (std::is_same_v<T, bool>) r.*m = s.i64(i) != 0;
          else r.*m = static_cast<T>(s.i64(i));
        },
        c.member);
    ++i;
  }
  return i;
}

// The tables of the catalog's kinds and their indexes, created after the rest of the schema (kSchema).
std::string catalog_schema() {
  return create_table("metrics", catalog::kMetrics, /*of_window=*/true) +
         create_table("communicators", catalog::kCommunicators) + create_table("steps", catalog::kSteps) +
         create_table("collectives", catalog::kCollectives) + create_table("device_activity", catalog::kDeviceActivity) +
         create_table("launch_samples", catalog::kLaunchSamples, /*of_window=*/true);
}

uint64_t hash_bytes(const void* data, size_t n) {  // FNV-1a, 64 bit
  uint64_t h = 1469598103934665603ull;
  auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

class SqliteStore final : public Store {
 public:
  SqliteStore(std::string path, const SqliteTuning& tuning) : path_(std::move(path)), tuning_(tuning) {}
  ~SqliteStore() override { sqlite3_close_v2(db_); }

  Status open(Mode mode) {
    struct stat st{};
    bool exists = ::stat(path_.c_str(), &st) == 0;
    if (exists && S_ISDIR(st.st_mode)) return Error{path_ + " is a directory, not a strata store"};
    if (!exists && mode == Mode::kReadOnly) return Error{path_ + ": no such file"};
    if (exists && st.st_size > 0) {
      if (auto s = check_header(); !s) return s;
      // Check in read-only mode first: a foreign file is never written.
      if (auto s = open_db(SQLITE_OPEN_READONLY); !s) return s;
      if (auto s = check_meta(); !s) return s;
      if (mode == Mode::kReadOnly) return added_columns(/*add=*/false);
      sqlite3_close_v2(db_);
      db_ = nullptr;
      if (auto s = open_db(SQLITE_OPEN_READWRITE); !s) return s;
      if (auto s = configure(); !s) return s;
      if (auto s = migrate(); !s) return s;
      if (auto s = exec(kUnusedIndexes); !s) return s;
      if (auto s = exec(kTimeIndexes); !s) return s;
      if (auto s = exec(hour_pid_indexes().c_str()); !s) return s;
      if (auto s = exec(kCollectorTimeIndexes); !s) return s;
      return added_columns(/*add=*/true);
    }
    if (mode == Mode::kReadOnly) return Error{path_ + " is empty: not a strata store"};
    if (auto s = open_db(SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE); !s) return s;
    if (auto s = configure(); !s) return s;
    if (auto s = exec("BEGIN"); !s) return s;
    if (auto s = exec(kSchema); !s) return s;
    if (auto s = exec(catalog_schema().c_str()); !s) return s;
    if (auto s = exec(kCollectorSchema); !s) return s;
    if (auto s = exec(kDiagnosisSchema); !s) return s;
    if (auto s = exec(kTimeIndexes); !s) return s;
    if (auto s = exec(hour_pid_indexes().c_str()); !s) return s;
    if (auto s = exec(kCollectorTimeIndexes); !s) return s;
    version_ = kSchemaVersion;
    Stmt m(db_, "INSERT INTO meta(key, value) VALUES('application','strata'),('schema_version',?)");
    m.bind(1, std::to_string(kSchemaVersion));
    if (m.step() != SQLITE_DONE) return err("writing metadata");
    if (auto s = exec("COMMIT"); !s) return s;
    return added_columns(/*add=*/true);
  }

  // Columns added to tables after their first release: added to an older file opened for writing
  // (they only add to a table, so the schema version stays); a read-only older file reads them as
  // their defaults.
  Status added_columns(bool add) {
    // The hour-and-process indexes (hour_pid_indexes): an older file read without writing lacks them,
    // and a read of one process there goes the old way (a hour list's first and last would each scan
    // the table).
    hour_pid_tables_.clear();
    {
      Stmt s(db_, "SELECT tbl_name FROM sqlite_master WHERE type='index' AND name IN "
                  "('collectives_by_hour_pid','device_activity_by_hour_pid')");
      int rc;
      while ((rc = s.step()) == SQLITE_ROW) hour_pid_tables_.insert(s.text(0));
      if (rc != SQLITE_DONE) return err("reading the indexes");
    }
    if (auto s = identity_columns(add); !s) return s;
    return catalog_columns(add);
  }

  // The catalog's kinds (store/catalog.h): a column of a kind that an older file's table lacks is
  // added as NOT NULL with its default (0 or '', as an older agent's message reads it).
  Status catalog_columns(bool add) {
    Status st;
    catalog::for_each_kind([&](const char* table, const auto& columns) {
      if (!st) return;
      std::set<std::string> have;
      {
        Stmt s(db_, (std::string("SELECT name FROM pragma_table_info('") + table + "')").c_str());
        int rc;
        while ((rc = s.step()) == SQLITE_ROW) have.insert(s.text(0));
        if (rc != SQLITE_DONE) {
          st = err(std::string("reading the ") + table + " table's columns");
          return;
        }
      }
      for (const auto& c : columns) {
        if (have.count(c.name)) continue;
        if (!add) {
          missing_.insert(std::string(table) + "." + c.name);
          continue;
        }
        const std::string sql = std::string("ALTER TABLE ") + table + " ADD COLUMN " + c.name + " " +
                                catalog::sqlite_type(c) + " NOT NULL DEFAULT " + catalog::default_literal(c);
        if (auto s = exec(sql.c_str()); !s) {
          st = s;
          return;
        }
      }
    });
    return st;
  }

  // The processes' pod / container identity columns: added to a file that lacks them (they only
  // add to a table, so the schema version stays); a read-only file without them reads them empty.
  Status identity_columns(bool add) {
    std::set<std::string> have;
    {
      Stmt s(db_, "SELECT name FROM pragma_table_info('processes')");
      int rc;
      while ((rc = s.step()) == SQLITE_ROW) have.insert(s.text(0));
      if (rc != SQLITE_DONE) return err("reading the processes table's columns");
    }
    has_identity_ = true;
    for (const char* c : {"pod_uid", "container_id", "pod_name", "pod_namespace"}) {
      if (have.count(c)) continue;
      if (!add) {
        has_identity_ = false;
        continue;
      }
      std::string sql = std::string("ALTER TABLE processes ADD COLUMN ") + c + " TEXT NOT NULL DEFAULT ''";
      if (auto s = exec(sql.c_str()); !s) return s;
    }
    return fidelity_columns(add);
  }

  // The windows' fidelity columns (WindowFidelity, issue 19), added the same way: 0 and '' read as
  // "not said" (the recording's rate, unknown unwinding).
  Status fidelity_columns(bool add) {
    std::set<std::string> have;
    {
      Stmt s(db_, "SELECT name FROM pragma_table_info('windows')");
      int rc;
      while ((rc = s.step()) == SQLITE_ROW) have.insert(s.text(0));
      if (rc != SQLITE_DONE) return err("reading the windows table's columns");
    }
    has_fidelity_ = have.count("sample_hz") && have.count("unwinding");
    if (has_fidelity_ || !add) return {};
    if (!have.count("sample_hz"))
      if (auto s = exec("ALTER TABLE windows ADD COLUMN sample_hz INTEGER NOT NULL DEFAULT 0"); !s) return s;
    if (!have.count("unwinding"))
      if (auto s = exec("ALTER TABLE windows ADD COLUMN unwinding TEXT NOT NULL DEFAULT ''"); !s) return s;
    has_fidelity_ = true;
    return {};
  }

  Result<int64_t> begin_recording(const RecordingInfo& r) override {
    Stmt s(db_, "INSERT INTO recordings(node, command, started_ns, sample_hz, window_s) VALUES(?,?,?,?,?)");
    s.bind(1, r.node).bind(2, r.command).bind(3, static_cast<int64_t>(r.started_ns))
        .bind(4, static_cast<int64_t>(r.sample_hz)).bind(5, r.window_s);
    if (s.step() != SQLITE_DONE) return err("adding a recording");
    return static_cast<int64_t>(sqlite3_last_insert_rowid(db_));
  }

  Status end_recording(int64_t recording, uint64_t ended_ns) override {
    Stmt s(db_, "UPDATE recordings SET ended_ns=? WHERE id=?");
    s.bind(1, static_cast<int64_t>(ended_ns)).bind(2, recording);
    return s.step() == SQLITE_DONE ? Status{} : Status{err("ending a recording")};
  }

  Status put_process(int64_t recording, const ProcessInfo& p) override {
    Stmt s(db_,
           "INSERT INTO processes(recording_id,node,pid,ppid,start_ns,comm,command,job,rank,local_rank,world_size,"
           "pod_uid,container_id,pod_name,pod_namespace)"
           " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT(recording_id,node,pid,start_ns) DO UPDATE SET"
           " comm=excluded.comm, command=excluded.command, job=excluded.job, rank=excluded.rank,"
           " local_rank=excluded.local_rank, world_size=excluded.world_size, pod_uid=excluded.pod_uid,"
           " container_id=excluded.container_id, pod_name=excluded.pod_name, pod_namespace=excluded.pod_namespace");
    s.bind(1, recording).bind(2, p.node).bind(3, static_cast<int64_t>(p.pid))
        .bind(4, static_cast<int64_t>(p.ppid)).bind(5, static_cast<int64_t>(p.start_ns)).bind(6, p.comm)
        .bind(7, p.command).bind(8, p.job).bind(9, static_cast<int64_t>(p.rank))
        .bind(10, static_cast<int64_t>(p.local_rank)).bind(11, static_cast<int64_t>(p.world_size))
        .bind(12, p.pod_uid).bind(13, p.container_id).bind(14, p.pod_name).bind(15, p.pod_namespace);
    return s.step() == SQLITE_DONE ? Status{} : Status{err("adding process " + std::to_string(p.pid))};
  }

  Result<int64_t> intern_frame(const Frame& f) {
    std::string key = std::to_string(static_cast<int>(f.kind)) + '\0' + f.build_id + '\0' + f.module + '\0' +
                      std::to_string(f.offset);
    if (f.kind == FrameKind::kPython) key += '\0' + f.function + '\0' + f.file;
    auto it = frame_ids_.find(key);
    if (it != frame_ids_.end()) return it->second;
    if (!insert_frame_) {
      insert_frame_ = std::make_unique<Stmt>(
          db_, "INSERT INTO frames(kind,build_id,module,offset,function,file,line) VALUES(?,?,?,?,?,?,?)"
               " ON CONFLICT(kind,build_id,module,offset) DO NOTHING");
      select_frame_ = std::make_unique<Stmt>(
          db_, "SELECT id FROM frames WHERE kind=? AND build_id=? AND module=? AND offset=?");
    }
    auto& ins = *insert_frame_;
    ins.reset();
    ins.bind(1, static_cast<int64_t>(f.kind)).bind(2, f.build_id).bind(3, f.module)
        .bind(4, static_cast<int64_t>(f.offset));
    if (!f.function.empty()) ins.bind(5, f.function);
    if (!f.file.empty()) ins.bind(6, f.file);
    if (f.line) ins.bind(7, static_cast<int64_t>(f.line));
    const int inserted = ins.step();
    ins.reset();
    if (inserted != SQLITE_DONE) return err("adding a frame");
    auto& sel = *select_frame_;
    sel.reset();
    sel.bind(1, static_cast<int64_t>(f.kind)).bind(2, f.build_id).bind(3, f.module)
        .bind(4, static_cast<int64_t>(f.offset));
    const int found = sel.step();
    const int64_t id = found == SQLITE_ROW ? sel.i64(0) : 0;
    // Reset at once: a kept statement left on its row holds a read transaction on the connection,
    // which then can never checkpoint its write-ahead log ("database table is locked").
    sel.reset();
    if (found != SQLITE_ROW) return err("finding a frame");
    if (frame_ids_.size() >= kMaxCachedFrameIds) {
      frame_ids_.clear();
      cache_resets_++;
    }
    frame_ids_.emplace(std::move(key), id);
    return id;
  }

  Result<int64_t> intern_stack(const Stack& stack, UnwindMethod method) override {
    std::vector<int64_t> ids;
    ids.reserve(stack.size());
    for (const auto& f : stack) {
      auto id = intern_frame(f);
      if (!id) return id.error();
      ids.push_back(*id);
    }
    std::string blob(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(int64_t));
    std::string key = blob + static_cast<char>(method);
    auto cached = stack_ids_.find(key);
    if (cached != stack_ids_.end()) return cached->second;
    if (stack_ids_.size() >= kMaxCachedStackIds) {
      stack_ids_.clear();
      cache_resets_++;
    }
    int64_t h = static_cast<int64_t>(hash_bytes(key.data(), key.size()));
    Stmt sel(db_, "SELECT id, frames FROM stacks WHERE hash=? AND method=?");
    sel.bind(1, h).bind(2, static_cast<int64_t>(method));
    while (sel.step() == SQLITE_ROW) {
      if (sel.blob(1) == blob) {
        int64_t id = sel.i64(0);
        stack_ids_.emplace(std::move(key), id);
        return id;
      }
    }
    Stmt ins(db_, "INSERT INTO stacks(hash, method, frames) VALUES(?,?,?)");
    ins.bind(1, h).bind(2, static_cast<int64_t>(method)).bind_blob(3, blob.data(), blob.size());
    if (ins.step() != SQLITE_DONE) return err("adding a stack");
    int64_t id = sqlite3_last_insert_rowid(db_);
    stack_ids_.emplace(std::move(key), id);
    return id;
  }

  Status put_window(int64_t recording, uint64_t start_ns, uint64_t end_ns, CountKind kind,
                    const std::vector<StackCount>& counts, const WindowFidelity& fidelity) override {
    Stmt w(db_, "INSERT INTO windows(recording_id,start_ns,end_ns,sample_hz,unwinding) VALUES(?,?,?,?,?)");
    w.bind(1, recording).bind(2, static_cast<int64_t>(start_ns)).bind(3, static_cast<int64_t>(end_ns))
        .bind(4, static_cast<int64_t>(fidelity.sample_hz)).bind(5, fidelity.unwinding);
    if (w.step() != SQLITE_DONE) return err("adding a window");
    int64_t window = sqlite3_last_insert_rowid(db_);
    Stmt s(db_,
           "INSERT INTO stack_counts(window_id,recording_id,kind,pid,tid,thread_comm,stack_id,value)"
           " VALUES(?,?,?,?,?,?,?,?)");
    for (const auto& c : counts) {
      s.reset();
      s.bind(1, window).bind(2, recording).bind(3, static_cast<int64_t>(kind))
          .bind(4, static_cast<int64_t>(c.pid)).bind(5, static_cast<int64_t>(c.tid)).bind(6, c.thread_comm)
          .bind(7, c.stack_id).bind(8, static_cast<int64_t>(c.value));
      if (s.step() != SQLITE_DONE) return err("adding stack counts");
    }
    return {};
  }

  Status put_stat(int64_t recording, const std::string& key, double value) override {
    Stmt s(db_, "INSERT OR REPLACE INTO agent_stats(recording_id,key,value) VALUES(?,?,?)");
    s.bind(1, recording).bind(2, key).bind(3, value);
    return s.step() == SQLITE_DONE ? Status{} : Status{err("adding a statistic")};
  }

  Status put_metrics(int64_t recording, uint64_t start_ns, uint64_t end_ns,
                     const std::vector<Metric>& metrics) override {
    return put_window_rows("metrics", catalog::kMetrics, recording, start_ns, end_ns, metrics);
  }

  Result<std::vector<MetricRow>> metrics(const std::string& prefix, std::optional<int64_t> recording) override {
    RowQuery q;
    q.prefix = prefix;
    q.recording = recording;
    return read_metrics(q, "x.start_ns, x.pid, x.name, x.label");
  }

  // The span queries' orders (diagnose::span_key holds rows read apart in the same one).
  static constexpr const char* kMetricsSpanOrder = "x.start_ns, r.node, x.pid, x.name, x.label";
  static constexpr const char* kCollectivesSpanOrder = "x.enter_ns, r.node, x.pid";
  static constexpr const char* kDeviceSpanOrder = "x.start_ns, r.node, x.pid";
  // Where a collective ends, as the index collectives_by_end has it (one without an exit: just after
  // its entry).
  static constexpr const char* kCollectivesEnd = "MAX(x.exit_ns, x.enter_ns + 1)";
  static constexpr const char* kStepsSpanOrder = "x.start_ns, r.node, x.pid";

  Result<std::vector<MetricRow>> query_metrics(const RowQuery& q) override {
    return read_metrics(q, kMetricsSpanOrder);
  }

  Result<std::vector<MetricRow>> read_metrics(const RowQuery& q, const char* order) {
    std::vector<MetricRow> out;
    if (auto st = read_metrics_into(q, order, out); !st) return st.error();
    return out;
  }

  Status append_metrics(const RowQuery& q, std::vector<MetricRow>& out) override {
    return read_metrics_into(q, kMetricsSpanOrder, out);
  }

  Status read_metrics_into(const RowQuery& query, const char* order, std::vector<MetricRow>& out) {
    auto walk = by_rowid(query, "metrics", "x.end_ns");
    if (!walk) return walk.error();
    const RowQuery& q = *walk;
    Select sel(q, "metrics", "x.start_ns", "x.end_ns", order);
    sel.where += " AND substr(x.name,1,?)=?";
    Stmt s(db_, sel.sql("x.start_ns,x.end_ns," + select_columns("metrics", catalog::kMetrics, missing_)).c_str());
    int n = sel.bind(s);
    s.bind(n + 1, static_cast<int64_t>(q.prefix.size())).bind(n + 2, q.prefix);
    int rc;
    while ((rc = s.step()) == SQLITE_ROW) {
      MetricRow& r = out.emplace_back();
      r.start_ns = static_cast<uint64_t>(s.i64(0));
      r.end_ns = static_cast<uint64_t>(s.i64(1));
      r.node = s.text(read_row(s, 2, catalog::kMetrics, r.metric));
      if (q.keep_process && !q.keep_process(r.node, r.metric.pid)) out.pop_back();
    }
    if (rc != SQLITE_DONE) return err("reading metrics");
    return {};
  }

  Status put_communicators(int64_t rec, const std::vector<CommunicatorRecord>& rows) override {
    return put_rows("communicators", catalog::kCommunicators, rec, rows);
  }

  Status put_collectives(int64_t rec, const std::vector<CollectiveRecord>& rows) override {
    return put_rows("collectives", catalog::kCollectives, rec, rows);
  }

  Status put_device_activity(int64_t rec, const std::vector<DeviceActivity>& rows) override {
    return put_rows("device_activity", catalog::kDeviceActivity, rec, rows);
  }

  Status put_steps(int64_t rec, const std::vector<StepRecord>& rows) override {
    return put_rows("steps", catalog::kSteps, rec, rows);
  }

  // Adds rows of a catalog kind (store/catalog.h) to its table.
  template <typename Row, typename Msg, size_t N>
  Status put_rows(const char* table, const catalog::Column<Row, Msg> (&columns)[N], int64_t rec,
                  const std::vector<Row>& rows) {
    Stmt s(db_, insert_sql(table, columns).c_str());
    for (const auto& r : rows) {
      s.reset();
      s.bind(1, rec);
      bind_row(s, 2, columns, r);
      if (s.step() != SQLITE_DONE) return err(std::string("adding ") + table);
    }
    return {};
  }

  Status put_launch_samples(int64_t rec, uint64_t start_ns, uint64_t end_ns,
                            const std::vector<LaunchSample>& rows) override {
    return put_window_rows("launch_samples", catalog::kLaunchSamples, rec, start_ns, end_ns, rows);
  }

  Result<LaunchSamples> query_launch_samples(const RowQuery& q) override {
    Select sel(q, "launch_samples", "x.start_ns", "x.end_ns", "x.start_ns, r.node, x.pid, x.tid, x.kernel, x.stack_id");
    sel.where += " AND substr(x.kernel,1,?)=?";
    Stmt s(db_, sel.sql("x.start_ns,x.end_ns," + select_columns("launch_samples", catalog::kLaunchSamples, missing_)).c_str());
    int n = sel.bind(s);
    s.bind(n + 1, static_cast<int64_t>(q.prefix.size())).bind(n + 2, q.prefix);
    LaunchSamples out;
    std::unordered_map<int64_t, uint32_t> stack_index;
    std::vector<int64_t> stack_ids;
    int rc;
    while ((rc = s.step()) == SQLITE_ROW) {
      LaunchSampleRow r;
      r.start_ns = static_cast<uint64_t>(s.i64(0));
      r.end_ns = static_cast<uint64_t>(s.i64(1));
      r.node = s.text(read_row(s, 2, catalog::kLaunchSamples, r.sample));
      auto [it, inserted] = stack_index.emplace(r.sample.stack_id, static_cast<uint32_t>(stack_ids.size()));
      if (inserted) stack_ids.push_back(r.sample.stack_id);
      r.stack_index = it->second;
      out.rows.push_back(std::move(r));
    }
    if (rc != SQLITE_DONE) return err("reading launch samples");
    if (auto st = read_stacks(stack_ids, out.stacks); !st) return st.error();
    return out;
  }

  Result<std::vector<CommunicatorRecord>> communicators(std::optional<int64_t> rec) override {
    RowQuery q;
    q.recording = rec;
    return read_rows(Select(q, "communicators", "x.init_ns", "x.init_ns", "x.init_ns"), catalog::kCommunicators);
  }

  // How long a walk of the table in rowid order (by_rowid) may be, in rows per row of the span, before
  // the index on the rows' end is the cheaper way. Measured on an 8,000-rank collector's store (1.44M
  // device rows, 1.08M of them in the last minute), counting the rows and their names' lengths: the
  // index with a table seek per row 2.69 s, the rowid walk 0.18 s (15x), the look that bounds it
  // 0.08 s. A row walked past costs less than one returned; at 4 walked rows per row returned the
  // walk is still several times the cheaper.
  static constexpr int64_t kRowidWalkPerRow = 4;

  // The same read, by rowid where that is cheaper. A span read open at its end (rows that end after
  // from_ns; no to_ns, no after_seq) finds its rows through the index on their end and seeks each
  // one in the table: at 8,000 ranks the seeks were most of a round's whole read. Rows are
  // appended, and written after they end (an agent ships a window when it closes), so a span's rows
  // lie at the table's end: the lowest rowid among them (an index-only look) bounds a walk in rowid
  // order that returns the same rows (after_seq set: Select's rowid range, the time test kept off
  // the index). Unless the walk would be long for what it returns (a row written long after its
  // time, an agent whose clock was ahead): then the index, as before. Only the order of rows read in
  // any order (RowQuery::any_order) can differ.
  Result<RowQuery> by_rowid(const RowQuery& q, const char* table, const std::string& end) {
    if (!q.from_ns || q.to_ns || q.after_seq || q.limit || q.offset) return q;
    const std::string from = std::to_string(std::min<uint64_t>(*q.from_ns, INT64_MAX));
    // The walk's end: where the caller's read stops (a refresh knows how far the table was written),
    // else the table's last row.
    const std::string last = q.upto_seq ? std::to_string(*q.upto_seq) : std::string("(SELECT MAX(rowid) FROM ") + table + ")";
    Stmt look(db_, ("SELECT MIN(x.rowid), COUNT(*), " + last + " FROM " + table + " x WHERE " + end + " > " + from).c_str());
    if (look.step() != SQLITE_ROW) return err(std::string("finding the span's rows in ") + table);
    if (look.is_null(0)) return q;  // no row: the index answers at once
    const int64_t lo = look.i64(0), count = look.i64(1), hi = look.i64(2);
    if (hi - lo + 1 > kRowidWalkPerRow * count) return q;
    RowQuery walk = q;
    walk.after_seq = lo - 1;
    return walk;
  }

  // " AND <hour> IN (...)": the hours (kPidBucketNs) in which a row of `table` that a read of the
  // span `q` returns began: from the longest row's length before the span's start to its end, within
  // the table's first and last hour (no span: all of those).
  static std::string pid_hours(const std::string& table, const std::string& start_column, const RowQuery& q) {
    const std::string column = start_column.substr(start_column.find('.') + 1);  // "x.enter_ns"
    std::string first = "(SELECT MIN(" + pid_bucket(column) + ") FROM " + table + ")";
    std::string last = "(SELECT MAX(" + pid_bucket(column) + ") FROM " + table + ")";
    if (q.from_ns) {
      const uint64_t from = *q.from_ns > kMaxRowSpanNs ? *q.from_ns - kMaxRowSpanNs : 0;
      first = "MAX(" + first + ", " + std::to_string(from / kPidBucketNs) + ")";
    }
    if (q.to_ns) last = "MIN(" + last + ", " + std::to_string((*q.to_ns > 0 ? *q.to_ns - 1 : 0) / kPidBucketNs) + ")";
    return " AND " + pid_bucket(start_column) + " IN (WITH RECURSIVE hour(h) AS (SELECT " + first +
           " UNION ALL SELECT h + 1 FROM hour WHERE h < " + last + ") SELECT h FROM hour)";
  }

  // One bounded read of a table whose rows belong to a recording: the row's node is its
  // recording's (joined in as the last column), and the RowQuery's filters become the WHERE clause.
  struct Select {
    const RowQuery& q;
    std::string table, start, end, order;
    std::string where = " WHERE 1=1";
    // `by_hour`: the table has its index by hour and process (hour_pid_indexes).
    Select(const RowQuery& query, std::string t, std::string start_col, std::string end_col, std::string order_by,
           bool by_hour = false)
        : q(query), table(std::move(t)), start(std::move(start_col)), end(std::move(end_col)), order(std::move(order_by)) {
      auto ns = [](uint64_t v) { return std::to_string(std::min<uint64_t>(v, INT64_MAX)); };  // SQLite's integers
      if (q.recording) where += " AND x.recording_id=" + std::to_string(*q.recording);
      // (Unary +: the time index finds the rows; by the node's recordings the planner would walk
      // each recording's whole history.)
      if (q.node) where += " AND +r.node=?";
      if (q.pid) where += " AND x.pid=" + std::to_string(*q.pid);
      // One process's collectives or device activity: by the hour index (hour_pid_indexes), hour by
      // hour. (Rows written since a read, below, are few: the rowid range finds them.)
      if (q.pid && !q.after_seq && by_hour) where += pid_hours(table, start, q);
      // Rows written since a reader's last read (after_seq): the rowid range finds them, and the time
      // index would walk the whole span. A read of a span bounded by rowid alone (upto_seq): the
      // time index finds the span, and a rowid range would walk the whole table (the planner took
      // it: a 6,000-step store's whole-span refresh did 4x the 300-step one's work). Unary + keeps
      // the planner off the other one.
      if (q.after_seq) where += " AND x.rowid > " + std::to_string(*q.after_seq);
      if (q.upto_seq) where += std::string(q.after_seq ? " AND x.rowid <= " : " AND +x.rowid <= ") + std::to_string(*q.upto_seq);
      if (q.from_ns) where += " AND " + std::string(q.after_seq ? "+(" + end + ")" : end) + " > " + ns(*q.from_ns);
      if (q.to_ns) {
        where += " AND " + start + " < " + ns(*q.to_ns);
        // The index on the end finds the span's rows: those that end at most kMaxRowSpanNs after it.
        where += " AND " + end + " < " + ns(*q.to_ns > UINT64_MAX - kMaxRowSpanNs ? UINT64_MAX : *q.to_ns + kMaxRowSpanNs);
      }
    }
    std::string sql(const std::string& columns) const {
      std::string s = "SELECT " + columns + ", r.node FROM " + table + " x JOIN recordings r ON r.id = x.recording_id" + where;
      if (!q.any_order || q.limit || q.offset) s += " ORDER BY " + order;  // pages need an order
      if (q.limit) s += " LIMIT " + std::to_string(std::min<uint64_t>(q.limit, INT64_MAX));
      if (q.offset) s += (q.limit ? "" : " LIMIT -1") + std::string(" OFFSET ") + std::to_string(std::min<uint64_t>(q.offset, INT64_MAX));
      return s;
    }
    // Binds the node (the only text parameter); returns how many parameters it bound.
    int bind(Stmt& s) const {
      if (!q.node) return 0;
      s.bind(1, *q.node);
      return 1;
    }
  };

  Result<std::vector<CollectiveRecord>> collectives(std::optional<int64_t> rec, std::optional<uint32_t> pid) override {
    RowQuery q;
    q.recording = rec;
    q.pid = pid;
    return read_collectives(q, "x.pid, r.node, x.enter_ns");
  }

  Result<std::vector<CollectiveRecord>> query_collectives(const RowQuery& q) override {
    return read_collectives(q, kCollectivesSpanOrder);
  }

  Status append_collectives(const RowQuery& q, std::vector<CollectiveRecord>& out) override {
    auto walk = by_rowid(q, "collectives", kCollectivesEnd);
    if (!walk) return walk.error();
    return read_rows_into(collectives_select(*walk, kCollectivesSpanOrder), catalog::kCollectives, out);
  }

  Result<std::vector<CollectiveRecord>> read_collectives(const RowQuery& q, const char* order) {
    auto walk = by_rowid(q, "collectives", kCollectivesEnd);
    if (!walk) return walk.error();
    return read_rows(collectives_select(*walk, order), catalog::kCollectives);
  }

  Select collectives_select(const RowQuery& q, const char* order) const {
    return Select(q, "collectives", "x.enter_ns", kCollectivesEnd, order, hour_pid_tables_.count("collectives") > 0);
  }

  Result<std::vector<DeviceActivity>> device_activity(std::optional<int64_t> rec, std::optional<uint32_t> pid) override {
    RowQuery q;
    q.recording = rec;
    q.pid = pid;
    return read_device_activity(q, "x.pid, r.node, x.start_ns");
  }

  Result<std::vector<DeviceActivity>> query_device_activity(const RowQuery& q) override {
    return read_device_activity(q, kDeviceSpanOrder);
  }

  Status append_device_activity(const RowQuery& q, std::vector<DeviceActivity>& out) override {
    auto walk = by_rowid(q, "device_activity", "x.end_ns");
    if (!walk) return walk.error();
    return read_rows_into(device_activity_select(*walk, kDeviceSpanOrder), catalog::kDeviceActivity, out);
  }

  Result<std::vector<DeviceActivity>> read_device_activity(const RowQuery& q, const char* order) {
    auto walk = by_rowid(q, "device_activity", "x.end_ns");
    if (!walk) return walk.error();
    return read_rows(device_activity_select(*walk, order), catalog::kDeviceActivity);
  }

  Select device_activity_select(const RowQuery& q, const char* order) const {
    return Select(q, "device_activity", "x.start_ns", "x.end_ns", order, hour_pid_tables_.count("device_activity") > 0);
  }

  Result<std::vector<StepRecord>> steps(std::optional<int64_t> rec, std::optional<uint32_t> pid) override {
    RowQuery q;
    q.recording = rec;
    q.pid = pid;
    return read_steps(q, "x.pid, r.node, x.step");
  }

  Result<std::vector<StepRecord>> query_steps(const RowQuery& q) override {
    return read_steps(q, kStepsSpanOrder);
  }

  Status append_steps(const RowQuery& q, std::vector<StepRecord>& out) override {
    auto walk = by_rowid(q, "steps", "x.end_ns");
    if (!walk) return walk.error();
    return read_rows_into(steps_select(*walk, kStepsSpanOrder), catalog::kSteps, out);
  }

  Result<std::vector<StepRecord>> read_steps(const RowQuery& q, const char* order) {
    auto walk = by_rowid(q, "steps", "x.end_ns");
    if (!walk) return walk.error();
    return read_rows(steps_select(*walk, order), catalog::kSteps);
  }

  static Select steps_select(const RowQuery& q, const char* order) {
    return Select(q, "steps", "x.start_ns", "x.end_ns", order);
  }

  // Adds rows of a catalog kind counted per window (`of_window`) to its table.
  template <typename Row, typename Msg, size_t N>
  Status put_window_rows(const char* table, const catalog::Column<Row, Msg> (&columns)[N], int64_t rec,
                         uint64_t start_ns, uint64_t end_ns, const std::vector<Row>& rows) {
    Stmt s(db_, insert_sql(table, columns, /*of_window=*/true).c_str());
    for (const auto& r : rows) {
      s.reset();
      s.bind(1, rec).bind(2, i64(start_ns)).bind(3, i64(end_ns));
      bind_row(s, 4, columns, r);
      if (s.step() != SQLITE_DONE) return err(std::string("adding ") + table);
    }
    return {};
  }

  // Reads the rows of a catalog kind that `sel` selects; each carries its recording's node.
  template <typename Row, typename Msg, size_t N>
  Result<std::vector<Row>> read_rows(const Select& sel, const catalog::Column<Row, Msg> (&columns)[N]) {
    std::vector<Row> out;
    if (auto st = read_rows_into(sel, columns, out); !st) return st.error();
    return out;
  }

  // The same, appended to `out`.
  template <typename Row, typename Msg, size_t N>
  Status read_rows_into(const Select& sel, const catalog::Column<Row, Msg> (&columns)[N], std::vector<Row>& out) {
    Stmt s(db_, sel.sql(select_columns(sel.table.c_str(), columns, missing_)).c_str());
    sel.bind(s);
    int rc;
    while ((rc = s.step()) == SQLITE_ROW) {
      Row& r = out.emplace_back();
      r.node = s.text(read_row(s, 0, columns, r));
      if constexpr (requires { r.pid; }) {
        if (sel.q.keep_process && !sel.q.keep_process(r.node, r.pid)) out.pop_back();
      }
    }
    if (rc != SQLITE_DONE) return err("reading " + sel.table);
    return {};
  }

  Result<std::vector<ThreadWindow>> thread_windows(const RowQuery& q) override {
    std::string sql =
        std::string("SELECT w.start_ns, w.end_ns, sc.pid, sc.tid, sc.thread_comm, SUM(sc.value), r.node, ") +
        window_hz() + " FROM stack_counts sc"
        " JOIN windows w ON w.id = sc.window_id JOIN recordings r ON r.id = sc.recording_id WHERE sc.kind = 0";
    if (q.recording) sql += " AND sc.recording_id=" + std::to_string(*q.recording);
    if (q.pid) sql += " AND sc.pid=" + std::to_string(*q.pid);
    if (q.node || q.pid || q.from_ns || q.to_ns) {
      // The windows of the node's (or every) recording in the span, each looked up by window and
      // process (stack_counts_by_window): a timeline's few processes, never the whole table.
      auto ns = [](uint64_t v) { return std::to_string(std::min<uint64_t>(v, INT64_MAX)); };  // SQLite's integers
      sql += " AND sc.window_id IN (SELECT id FROM windows WHERE 1=1";
      if (q.recording) sql += " AND recording_id=" + std::to_string(*q.recording);
      if (q.node) sql += " AND recording_id IN (SELECT id FROM recordings WHERE node=?)";
      if (q.from_ns) sql += " AND end_ns > " + ns(*q.from_ns);
      if (q.to_ns) sql += " AND start_ns < " + ns(*q.to_ns);
      sql += ")";
    }
    sql += " GROUP BY sc.window_id, sc.pid, sc.tid, sc.thread_comm ORDER BY w.start_ns, r.node, sc.pid, sc.tid";
    Stmt s(db_, sql.c_str());
    if (q.node) s.bind(1, *q.node);
    std::vector<ThreadWindow> out;
    int rc;
    while ((rc = s.step()) == SQLITE_ROW) {
      ThreadWindow t;
      t.start_ns = static_cast<uint64_t>(s.i64(0));
      t.end_ns = static_cast<uint64_t>(s.i64(1));
      t.pid = static_cast<uint32_t>(s.i64(2));
      t.tid = static_cast<uint32_t>(s.i64(3));
      t.comm = s.text(4);
      t.samples = static_cast<uint64_t>(s.i64(5));
      t.node = s.text(6);
      t.sample_hz = static_cast<unsigned>(s.i64(7));
      out.push_back(std::move(t));
    }
    if (rc != SQLITE_DONE) return err("reading thread activity");
    return out;
  }

  Result<unsigned> sample_hz(std::optional<int64_t> rec) override {
    std::string sql = "SELECT MAX(sample_hz) FROM recordings";
    if (rec) sql += " WHERE id=" + std::to_string(*rec);
    Stmt s(db_, sql.c_str());
    if (s.step() != SQLITE_ROW) return err("reading recordings");
    return static_cast<unsigned>(s.is_null(0) ? 0 : s.i64(0));
  }

  Result<std::vector<ReducedFidelity>> reduced_fidelity(std::optional<int64_t> rec, std::optional<uint64_t> from_ns,
                                                        std::optional<uint64_t> to_ns) override {
    std::vector<ReducedFidelity> out;
    if (!has_fidelity_) return out;  // a file from before: nothing was said
    // The reduced windows, in order per recording. Off-CPU windows (measured, not sampled) say no
    // rate: sample_hz 0 leaves them out.
    std::string sql =
        "SELECT w.recording_id, r.node, w.start_ns, w.end_ns, r.sample_hz, w.sample_hz, w.unwinding FROM windows w"
        " JOIN recordings r ON r.id = w.recording_id WHERE w.sample_hz > 0 AND (w.sample_hz < r.sample_hz OR "
        "w.unwinding = '" + std::string(kUnwindingFramePointers) + "')";
    if (rec) sql += " AND w.recording_id=" + std::to_string(*rec);
    // By the windows' end index: a page's span, not the whole table.
    if (from_ns) sql += " AND w.end_ns > " + std::to_string(static_cast<int64_t>(std::min<uint64_t>(*from_ns, INT64_MAX)));
    if (to_ns) sql += " AND w.start_ns < " + std::to_string(static_cast<int64_t>(std::min<uint64_t>(*to_ns, INT64_MAX)));
    sql += " ORDER BY w.recording_id, w.start_ns";
    Stmt s(db_, sql.c_str());
    std::vector<FidelityWindow> rows;
    int rc;
    while ((rc = s.step()) == SQLITE_ROW)
      rows.push_back({s.i64(0), s.text(1), static_cast<uint64_t>(s.i64(2)), static_cast<uint64_t>(s.i64(3)),
                      static_cast<unsigned>(s.i64(4)), static_cast<unsigned>(s.i64(5)), s.text(6)});
    if (rc != SQLITE_DONE) return err("reading the windows' fidelity");
    return reduced_runs(rows);
  }

  Result<std::vector<FrameRow>> unsymbolized_frames() override {
    Stmt s(db_, "SELECT id,kind,build_id,module,offset FROM frames WHERE function IS NULL AND kind IN (0,1)");
    std::vector<FrameRow> rows;
    while (s.step() == SQLITE_ROW) {
      FrameRow r;
      r.id = s.i64(0);
      r.frame.kind = static_cast<FrameKind>(s.i64(1));
      r.frame.build_id = s.text(2);
      r.frame.module = s.text(3);
      r.frame.offset = static_cast<uint64_t>(s.i64(4));
      rows.push_back(std::move(r));
    }
    return rows;
  }

  Status update_frame_symbols(const std::vector<FrameRow>& rows) override {
    // An empty string marks "tried, unknown" so frames are not symbolized again and again.
    Stmt s(db_, "UPDATE frames SET function=?, file=?, line=? WHERE id=?");
    for (const auto& r : rows) {
      s.reset();
      s.bind(1, r.frame.function).bind(2, r.frame.file).bind(3, static_cast<int64_t>(r.frame.line)).bind(4, r.id);
      if (s.step() != SQLITE_DONE) return err("updating frame symbols");
    }
    return {};
  }

  Status begin() override { return exec("BEGIN IMMEDIATE"); }
  Status commit() override { return exec("COMMIT"); }
  Status rollback() override {
    // The caches may name rows the rollback removes.
    frame_ids_.clear();
    stack_ids_.clear();
    return exec("ROLLBACK");
  }

  Result<bool> batch_applied(const std::string& agent, uint64_t batch_id) override {
    Stmt s(db_, "SELECT 1 FROM ingest_batches WHERE agent_id=? AND batch_id=?");
    s.bind(1, agent).bind(2, i64(batch_id));
    int rc = s.step();
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return err("reading ingest batches");
  }

  Status mark_batch_applied(const std::string& agent, uint64_t batch_id, uint64_t received_ns) override {
    Stmt s(db_, "INSERT INTO ingest_batches(agent_id,batch_id,received_ns) VALUES(?,?,?)");
    s.bind(1, agent).bind(2, i64(batch_id)).bind(3, i64(received_ns));
    return s.step() == SQLITE_DONE ? Status{} : Status{err("marking a batch applied")};
  }

  Result<std::vector<std::pair<int64_t, int64_t>>> agent_ids(const std::string& agent, AgentIdKind kind) override {
    Stmt s(db_, "SELECT local_id, store_id FROM agent_ids WHERE agent_id=? AND kind=?");
    s.bind(1, agent).bind(2, static_cast<int64_t>(kind));
    std::vector<std::pair<int64_t, int64_t>> out;
    int rc;
    while ((rc = s.step()) == SQLITE_ROW) out.emplace_back(s.i64(0), s.i64(1));
    if (rc != SQLITE_DONE) return err("reading agent ids");
    return out;
  }

  Result<std::optional<int64_t>> agent_id(const std::string& agent, AgentIdKind kind, int64_t local_id) override {
    Stmt s(db_, "SELECT store_id FROM agent_ids WHERE agent_id=? AND kind=? AND local_id=?");
    s.bind(1, agent).bind(2, static_cast<int64_t>(kind)).bind(3, local_id);
    int rc = s.step();
    if (rc == SQLITE_ROW) return std::optional<int64_t>{s.i64(0)};
    if (rc != SQLITE_DONE) return err("reading an agent id");
    return std::optional<int64_t>{};
  }

  Result<std::vector<std::pair<int64_t, int64_t>>> recent_agent_ids(const std::string& agent, AgentIdKind kind,
                                                                    size_t limit) override {
    Stmt s(db_, "SELECT local_id, store_id FROM agent_ids WHERE agent_id=? AND kind=? ORDER BY local_id DESC LIMIT ?");
    s.bind(1, agent).bind(2, static_cast<int64_t>(kind)).bind(3, static_cast<int64_t>(std::min<size_t>(limit, INT64_MAX)));
    std::vector<std::pair<int64_t, int64_t>> out;
    int rc;
    while ((rc = s.step()) == SQLITE_ROW) out.emplace_back(s.i64(0), s.i64(1));
    if (rc != SQLITE_DONE) return err("reading agent ids");
    return out;
  }

  Status put_agent_id(const std::string& agent, AgentIdKind kind, int64_t local_id, int64_t store_id) override {
    Stmt s(db_, "INSERT OR REPLACE INTO agent_ids(agent_id,kind,local_id,store_id) VALUES(?,?,?,?)");
    s.bind(1, agent).bind(2, static_cast<int64_t>(kind)).bind(3, local_id).bind(4, store_id);
    return s.step() == SQLITE_DONE ? Status{} : Status{err("adding an agent id")};
  }

  Status put_agent_status(const AgentStatus& a) override {
    Stmt s(db_, "INSERT OR REPLACE INTO agents(agent_id,node,last_seen_ns,last_batch,interval_s,health)"
                " VALUES(?,?,?,?,?,?)");
    s.bind(1, a.agent_id).bind(2, a.node).bind(3, i64(a.last_seen_ns)).bind(4, i64(a.last_batch))
        .bind(5, a.interval_s).bind(6, a.health_json);
    return s.step() == SQLITE_DONE ? Status{} : Status{err("updating an agent")};
  }

  Result<std::vector<AgentStatus>> agents() override {
    std::vector<AgentStatus> out;
    if (version_ < 2) return out;  // a read-only version 1 file: no collector ever wrote it
    Stmt s(db_, "SELECT agent_id,node,last_seen_ns,last_batch,interval_s,health FROM agents ORDER BY node, agent_id");
    int rc;
    while ((rc = s.step()) == SQLITE_ROW) {
      AgentStatus a;
      a.agent_id = s.text(0);
      a.node = s.text(1);
      a.last_seen_ns = static_cast<uint64_t>(s.i64(2));
      a.last_batch = static_cast<uint64_t>(s.i64(3));
      a.interval_s = s.dbl(4);
      a.health_json = s.text(5);
      out.push_back(std::move(a));
    }
    if (rc != SQLITE_DONE) return err("reading agents");
    return out;
  }

  Status put_diagnosis(const KeptDiagnosis& d, const std::vector<KeptFinding>& findings) override {
    if (version_ < 3) return Error{path_ + ": schema " + std::to_string(version_) + " keeps no diagnoses"};
    if (auto s = exec("BEGIN IMMEDIATE"); !s) return s;
    Status st = [&]() -> Status {
      Stmt s(db_, "INSERT OR REPLACE INTO diagnoses(job,diagnosed_ns,window_start_ns,window_end_ns,ranks,findings,"
                  "report_json,report_text) VALUES(?,?,?,?,?,?,?,?)");
      s.bind(1, d.job).bind(2, i64(d.diagnosed_ns)).bind(3, i64(d.window_start_ns)).bind(4, i64(d.window_end_ns))
          .bind(5, i64(d.ranks)).bind(6, i64(d.findings)).bind(7, d.report_json).bind(8, d.report_text);
      if (s.step() != SQLITE_DONE) return err("keeping a diagnosis");
      Stmt f(db_, "INSERT INTO findings(job,diagnosed_ns,window_start_ns,window_end_ns,rank,node,layer,cause,culprit,"
                  "lost_ms_per_step,confidence,evidence) VALUES(?,?,?,?,?,?,?,?,?,?,?,?)");
      for (const auto& x : findings) {
        f.reset();
        f.bind(1, x.job).bind(2, i64(x.diagnosed_ns)).bind(3, i64(x.window_start_ns)).bind(4, i64(x.window_end_ns))
            .bind(5, i64(x.rank)).bind(6, x.node).bind(7, x.layer).bind(8, x.cause).bind(9, x.culprit)
            .bind(10, x.lost_ms_per_step).bind(11, x.confidence).bind(12, x.evidence_json);
        if (f.step() != SQLITE_DONE) return err("keeping a finding");
      }
      return {};
    }();
    if (!st) {
      (void)exec("ROLLBACK");
      return st;
    }
    return exec("COMMIT");
  }

  Result<std::vector<KeptDiagnosis>> kept_diagnoses(const std::string* job) override {
    std::vector<KeptDiagnosis> out;
    if (version_ < 3) return out;
    std::string sql = "SELECT job,diagnosed_ns,window_start_ns,window_end_ns,ranks,findings,report_json,report_text"
                      " FROM diagnoses";
    if (job) sql += " WHERE job=?";
    Stmt s(db_, (sql + " ORDER BY job").c_str());
    if (job) s.bind(1, *job);
    int rc;
    while ((rc = s.step()) == SQLITE_ROW) {
      KeptDiagnosis d;
      d.job = s.text(0);
      d.diagnosed_ns = static_cast<uint64_t>(s.i64(1));
      d.window_start_ns = static_cast<uint64_t>(s.i64(2));
      d.window_end_ns = static_cast<uint64_t>(s.i64(3));
      d.ranks = static_cast<uint32_t>(s.i64(4));
      d.findings = static_cast<uint32_t>(s.i64(5));
      d.report_json = s.text(6);
      d.report_text = s.text(7);
      out.push_back(std::move(d));
    }
    if (rc != SQLITE_DONE) return err("reading diagnoses");
    return out;
  }

  Result<std::vector<FindingHistory>> finding_history(const std::string& job) override {
    std::vector<FindingHistory> out;
    if (version_ < 3) return out;
    // SQLite takes the bare columns from the row that holds MAX(diagnosed_ns): the latest wording.
    Stmt s(db_, "SELECT rank, node, layer, cause, culprit, MAX(diagnosed_ns), MIN(diagnosed_ns), MIN(window_start_ns),"
                " COUNT(*), MAX(lost_ms_per_step) FROM findings WHERE job=? GROUP BY rank, cause"
                " ORDER BY 6 DESC, 10 DESC");
    s.bind(1, job);
    int rc;
    while ((rc = s.step()) == SQLITE_ROW) {
      FindingHistory h;
      h.rank = static_cast<int>(s.i64(0));
      h.node = s.text(1);
      h.layer = s.text(2);
      h.cause = s.text(3);
      h.culprit = s.text(4);
      h.last_seen_ns = static_cast<uint64_t>(s.i64(5));
      h.first_seen_ns = static_cast<uint64_t>(s.i64(6));
      h.first_window_start_ns = static_cast<uint64_t>(s.i64(7));
      h.rounds = static_cast<uint64_t>(s.i64(8));
      h.max_lost_ms_per_step = s.dbl(9);
      out.push_back(std::move(h));
    }
    if (rc != SQLITE_DONE) return err("reading finding history");
    return out;
  }

  Result<Profile> load_profile(const ProfileFilter& f) override {
    Profile p;
    p.kind = f.kind == CountKind::kOnCpu ? "oncpu" : "offcpu";
    p.value_unit = f.kind == CountKind::kOnCpu ? "count" : "microseconds";
    {
      std::string where = " WHERE 1=1";
      if (f.recording) where += " AND id=" + std::to_string(*f.recording);
      if (f.node) where += " AND node=?";  // one node's profile: its recordings (by the index)
      Stmt r(db_, ("SELECT MIN(started_ns), MAX(COALESCE(ended_ns, started_ns)), MAX(sample_hz) FROM recordings" +
                    where).c_str());
      if (f.node) r.bind(1, *f.node);
      if (r.step() == SQLITE_ROW && !r.is_null(0)) {
        p.start_ns = static_cast<uint64_t>(r.i64(0));
        p.duration_ns = static_cast<uint64_t>(r.i64(1) - r.i64(0));
        int64_t hz = r.i64(2);
        p.period_ns = hz > 0 ? 1'000'000'000ull / static_cast<uint64_t>(hz) : 0;
      }
    }
    // Samples per (node, pid, thread, stack): pids repeat across nodes, so the node (the recording's)
    // is part of a sample's identity.
    // ... and per window rate (WindowFidelity): counts at different rates are samples of different
    // periods, weighed by their own (Profile::weighted).
    std::string sql =
        "SELECT sc.pid, sc.tid, sc.thread_comm, sc.stack_id, SUM(sc.value), r.node, " + window_hz() +
        " FROM stack_counts sc JOIN recordings r ON r.id = sc.recording_id JOIN windows w ON w.id = sc.window_id"
        " WHERE sc.kind=?";
    if (f.node) sql += " AND +r.node=?";  // (unary +: by the windows of the span, not the node's whole history)
    if (f.pid) sql += " AND sc.pid=" + std::to_string(*f.pid);
    if (f.tid) sql += " AND sc.tid=" + std::to_string(*f.tid);
    if (f.recording) sql += " AND sc.recording_id=" + std::to_string(*f.recording);
    if (f.rank || f.job) {
      sql += " AND EXISTS (SELECT 1 FROM processes pr WHERE pr.recording_id=sc.recording_id AND pr.pid=sc.pid";
      if (f.rank) sql += " AND pr.rank=" + std::to_string(*f.rank);
      if (f.job) sql += " AND pr.job=" + sql_text(*f.job);
      sql += ")";
    }
    if (f.from_ns || f.to_ns) {
      // The windows that overlap [from, to); the profile then spans exactly those windows.
      auto ns = [](uint64_t v) { return std::to_string(std::min<uint64_t>(v, INT64_MAX)); };  // SQLite's integers
      std::string windows = "SELECT id FROM windows WHERE 1=1";
      if (f.from_ns) windows += " AND end_ns > " + ns(*f.from_ns);
      if (f.to_ns) {
        windows += " AND start_ns < " + ns(*f.to_ns);
        windows += " AND end_ns < " + ns(*f.to_ns > UINT64_MAX - kMaxRowSpanNs ? UINT64_MAX : *f.to_ns + kMaxRowSpanNs);
      }
      if (f.recording) windows += " AND recording_id=" + std::to_string(*f.recording);
      // One node's profile: that node's windows only (windows_by_recording_end finds them). Without
      // it the list held every node's windows of the span, each probed for the process: a read per
      // process grew with the nodes, and a hang's stall stacks, read rank by rank, with ranks x nodes.
      // The profile's span is then that node's windows' too.
      const bool of_node = f.node && !f.recording;
      if (of_node) windows += " AND recording_id IN (SELECT id FROM recordings WHERE node=?)";
      sql += " AND sc.window_id IN (" + windows + ")";
      Stmt span(db_, ("SELECT MIN(start_ns), MAX(end_ns) FROM windows WHERE id IN (" + windows + ")").c_str());
      if (of_node) span.bind(1, *f.node);
      if (span.step() == SQLITE_ROW && !span.is_null(0)) {
        p.start_ns = static_cast<uint64_t>(span.i64(0));
        p.duration_ns = static_cast<uint64_t>(span.i64(1) - span.i64(0));
      } else {
        p.duration_ns = 0;  // no window in the range: an empty profile
      }
    }
    // One process over all time: its recordings' windows, each looked up by window and process
    // (stack_counts_by_window; an index led by the process made ingest cost grow with the file).
    const bool pid_windows = f.pid && !f.from_ns && !f.to_ns;
    if (pid_windows) {
      sql += " AND sc.window_id IN (SELECT id FROM windows WHERE recording_id IN (SELECT id FROM recordings WHERE 1=1";
      if (f.recording) sql += " AND id=" + std::to_string(*f.recording);
      if (f.node) sql += " AND node=?";
      sql += "))";
    }
    sql += " GROUP BY r.node, sc.pid, sc.tid, sc.thread_comm, sc.stack_id, 7 ORDER BY r.node, sc.pid, sc.tid, sc.stack_id, 7 DESC";
    Stmt s(db_, sql.c_str());
    if (!s.ok()) return err("querying stack counts");
    s.bind(1, static_cast<int64_t>(f.kind));
    if (f.node) s.bind(2, *f.node);
    if (f.node && !f.recording && (f.from_ns || f.to_ns)) s.bind(3, *f.node);  // the node's windows
    if (f.node && pid_windows) s.bind(3, *f.node);                                // the process's windows
    std::unordered_map<int64_t, uint32_t> stack_index;
    std::vector<int64_t> stack_ids;
    int rc;
    while ((rc = s.step()) == SQLITE_ROW) {
      ProfileSample smp;
      smp.pid = static_cast<uint32_t>(s.i64(0));
      smp.tid = static_cast<uint32_t>(s.i64(1));
      smp.comm = s.text(2);
      int64_t sid = s.i64(3);
      smp.count = static_cast<uint64_t>(s.i64(4));
      smp.node = s.text(5);
      const int64_t hz = s.i64(6);
      if (f.kind == CountKind::kOnCpu && hz > 0) smp.period_ns = 1'000'000'000ull / static_cast<uint64_t>(hz);
      auto [it, inserted] = stack_index.emplace(sid, static_cast<uint32_t>(stack_ids.size()));
      if (inserted) stack_ids.push_back(sid);
      smp.stack_index = it->second;
      p.samples.push_back(std::move(smp));
    }
    if (rc != SQLITE_DONE) return err("reading stack counts");
    if (auto st = read_stacks(stack_ids, p.stacks); !st) return st.error();
    return p;
  }

  // The stacks of these ids, in their order: leaf first, inlined functions expanded.
  Status read_stacks(const std::vector<int64_t>& stack_ids, std::vector<Stack>& stacks) {
    std::unordered_map<int64_t, Frame> frames;
    Stmt fs(db_, "SELECT kind,build_id,module,offset,function,file,line FROM frames WHERE id=?");
    Stmt ss(db_, "SELECT frames FROM stacks WHERE id=?");
    stacks.assign(stack_ids.size(), Stack{});
    for (size_t i = 0; i < stack_ids.size(); ++i) {
      ss.reset();
      ss.bind(1, stack_ids[i]);
      if (ss.step() != SQLITE_ROW) return Error{"store is inconsistent: stack " + std::to_string(stack_ids[i]) + " missing"};
      std::string blob = ss.blob(0);
      if (blob.size() % sizeof(int64_t)) return Error{"store is corrupt: stack blob of odd size"};
      std::vector<int64_t> ids(blob.size() / sizeof(int64_t));
      if (!ids.empty()) std::memcpy(ids.data(), blob.data(), blob.size());  // an empty stack: data() is null
      for (int64_t fid : ids) {
        auto it = frames.find(fid);
        if (it == frames.end()) {
          fs.reset();
          fs.bind(1, fid);
          if (fs.step() != SQLITE_ROW) return Error{"store is inconsistent: frame " + std::to_string(fid) + " missing"};
          Frame fr;
          fr.kind = static_cast<FrameKind>(fs.i64(0));
          fr.build_id = fs.text(1);
          fr.module = fs.text(2);
          fr.offset = static_cast<uint64_t>(fs.i64(3));
          fr.function = fs.text(4);
          fr.file = fs.text(5);
          fr.line = static_cast<int>(fs.i64(6));
          it = frames.emplace(fid, std::move(fr)).first;
        }
        stacks[i].push_back(it->second);
      }
      expand_inlined(stacks[i]);
    }
    return {};
  }

  Result<std::vector<ProcessInfo>> processes(std::optional<int64_t> recording) override {
    std::string sql =
        std::string("SELECT pid,ppid,start_ns,node,comm,command,job,rank,local_rank,world_size,") +
        (has_identity_ ? "pod_uid,container_id,pod_name,pod_namespace" : "'','','',''") + " FROM processes";
    if (recording) sql += " WHERE recording_id=" + std::to_string(*recording);
    sql += " ORDER BY id";
    Stmt s(db_, sql.c_str());
    std::vector<ProcessInfo> out;
    int rc;
    while ((rc = s.step()) == SQLITE_ROW) {
      ProcessInfo p;
      p.pid = static_cast<uint32_t>(s.i64(0));
      p.ppid = static_cast<uint32_t>(s.i64(1));
      p.start_ns = static_cast<uint64_t>(s.i64(2));
      p.node = s.text(3);
      p.comm = s.text(4);
      p.command = s.text(5);
      p.job = s.text(6);
      p.rank = static_cast<int>(s.i64(7));
      p.local_rank = static_cast<int>(s.i64(8));
      p.world_size = static_cast<int>(s.i64(9));
      p.pod_uid = s.text(10);
      p.container_id = s.text(11);
      p.pod_name = s.text(12);
      p.pod_namespace = s.text(13);
      out.push_back(std::move(p));
    }
    if (rc != SQLITE_DONE) return err("reading processes");
    return out;
  }

  Result<std::vector<std::pair<std::string, double>>> stats(int64_t recording) override {
    Stmt s(db_, "SELECT key, value FROM agent_stats WHERE recording_id=? ORDER BY key");
    s.bind(1, recording);
    std::vector<std::pair<std::string, double>> out;
    while (s.step() == SQLITE_ROW) out.emplace_back(s.text(0), s.dbl(1));
    return out;
  }

  Result<std::optional<uint64_t>> latest_step_ns(std::optional<int64_t> recording) override {
    // MAX over an index whose leading columns the WHERE fixes: one look at the index's end.
    std::string sql = "SELECT MAX(end_ns) FROM steps";
    if (recording) sql += " WHERE recording_id=" + std::to_string(*recording);
    Stmt s(db_, sql.c_str());
    if (s.step() != SQLITE_ROW) return err("reading the latest step");
    if (s.is_null(0)) return std::optional<uint64_t>{};
    return std::optional<uint64_t>{static_cast<uint64_t>(s.i64(0))};
  }

  uint64_t read_work() const override { return work_; }

  Result<std::optional<uint64_t>> data_version() override {
    if (!sqlite3_get_autocommit(db_)) return std::optional<uint64_t>{};  // in a transaction
    // PRAGMA data_version changes with every commit of another connection (another process
    // writing the file), never with this connection's; the count of rows this connection changed
    // covers those. Either moving makes a new version.
    Stmt s(db_, "PRAGMA data_version");
    if (s.step() != SQLITE_ROW) return err("reading the data version");
    const int64_t others = s.i64(0);
    const int64_t own = sqlite3_total_changes64(db_);
    if (others != seen_data_version_ || own != seen_total_changes_) {
      seen_data_version_ = others;
      seen_total_changes_ = own;
      ++data_version_;
    }
    return std::optional<uint64_t>{data_version_};
  }

  Result<std::optional<WriteSeqs>> write_seqs() override {
    // Rows are appended (rowid = the largest + 1), and one writer commits at a time: every row up
    // to the largest rowid a read sees is committed. Each MAX is one look at the table's b-tree end.
    Stmt s(db_,
           "SELECT (SELECT MAX(rowid) FROM steps), (SELECT MAX(rowid) FROM collectives), "
           "(SELECT MAX(rowid) FROM device_activity), (SELECT MAX(rowid) FROM metrics)");
    if (s.step() != SQLITE_ROW) return err("reading the write sequences");
    WriteSeqs w;
    w.steps = s.is_null(0) ? 0 : s.i64(0);
    w.collectives = s.is_null(1) ? 0 : s.i64(1);
    w.device = s.is_null(2) ? 0 : s.i64(2);
    w.metrics = s.is_null(3) ? 0 : s.i64(3);
    return std::optional<WriteSeqs>{w};
  }

  uint64_t log_bytes() const override {
    struct stat st;
    return ::stat((path_ + "-wal").c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  }

  // Copies the whole write-ahead log into the database and truncates it to zero bytes. SQLite's
  // own checkpoints after each commit copy what they can but cannot restart the log while a reader
  // holds a snapshot in it: with overlapping readers it grows without bound (SQLite's "checkpoint
  // starvation"). This one waits for those readers (the busy timeout) and says when one stayed.
  Status truncate_log() override {
    Stmt s(db_, "PRAGMA wal_checkpoint(TRUNCATE)");
    int rc = s.ok() ? s.step() : SQLITE_ERROR;
    if (rc != SQLITE_ROW) return err("checkpointing the write-ahead log");
    if (s.i64(0) != 0)
      return Error{path_ + ": the write-ahead log could not be truncated: a reader stayed in it (" +
                   std::to_string(s.i64(1)) + " pages in the log, " + std::to_string(s.i64(2)) + " copied)"};
    return {};
  }

  Result<uint64_t> delete_before(uint64_t cutoff_ns, uint64_t max_rows) override {
    if (auto s = exec("BEGIN IMMEDIATE"); !s) return s.error();
    uint64_t deleted = 0;
    Status st = [&]() -> Status {
      const std::string cut = std::to_string(std::min<uint64_t>(cutoff_ns, INT64_MAX));
      const std::string lim = std::to_string(std::min<uint64_t>(max_rows, INT64_MAX));
      auto del = [&](const std::string& table, const std::string& column) -> Status {
        // By rowid, through the time index: at most max_rows rows, the oldest first.
        std::string sql = "DELETE FROM " + table + " WHERE rowid IN (SELECT rowid FROM " + table + " WHERE " + column +
                          " < " + cut + " ORDER BY " + column + " LIMIT " + lim + ")";
        if (auto s = exec(sql.c_str()); !s) return s;
        deleted += static_cast<uint64_t>(sqlite3_changes(db_));
        return {};
      };
      for (auto [table, column] : {std::pair{"steps", "end_ns"}, {"metrics", "end_ns"},
                                   {"collectives", "MAX(exit_ns, enter_ns + 1)"}, {"device_activity", "end_ns"},
                                   {"launch_samples", "end_ns"}}) {
        if (auto s = del(table, column); !s) return s;
      }
      // A stack window goes with its counts: the counts of the oldest windows first, then the
      // windows left without counts.
      std::string old_windows = "SELECT id FROM windows WHERE end_ns < " + cut + " ORDER BY end_ns LIMIT " + lim;
      std::string counts = "DELETE FROM stack_counts WHERE rowid IN (SELECT rowid FROM stack_counts WHERE window_id IN (" +
                           old_windows + ") LIMIT " + lim + ")";
      if (auto s = exec(counts.c_str()); !s) return s;
      uint64_t counts_deleted = static_cast<uint64_t>(sqlite3_changes(db_));
      deleted += counts_deleted;
      if (counts_deleted < max_rows) {
        std::string windows = "DELETE FROM windows WHERE id IN (" + old_windows +
                              ") AND NOT EXISTS (SELECT 1 FROM stack_counts sc WHERE sc.window_id = windows.id)";
        if (auto s = exec(windows.c_str()); !s) return s;
        deleted += static_cast<uint64_t>(sqlite3_changes(db_));
      }
      if (version_ >= 3) {
        if (auto s = del("findings", "diagnosed_ns"); !s) return s;
      }
      if (version_ >= 2) {
        if (auto s = del("ingest_batches", "received_ns"); !s) return s;
      }
      return {};
    }();
    if (!st) {
      (void)exec("ROLLBACK");
      return st.error();
    }
    if (auto s = exec("COMMIT"); !s) return s.error();
    return deleted;
  }

  Result<std::optional<int64_t>> latest_recording() override {
    Stmt s(db_, "SELECT MAX(id) FROM recordings");
    if (s.step() != SQLITE_ROW) return err("reading recordings");
    if (s.is_null(0)) return std::optional<int64_t>{};
    return std::optional<int64_t>{s.i64(0)};
  }

 private:
  Error err(const std::string& what) const {
    return Error{path_ + ": " + what + ": " + (db_ ? sqlite3_errmsg(db_) : "no database")};
  }

  Status exec(const char* sql) {
    char* msg = nullptr;
    if (sqlite3_exec(db_, sql, nullptr, nullptr, &msg) != SQLITE_OK) {
      std::string m = msg ? msg : "unknown error";
      sqlite3_free(msg);
      return Error{path_ + ": " + m};
    }
    return {};
  }

  Status check_header() {
    std::ifstream in(path_, std::ios::binary);
    char magic[16] = {};
    in.read(magic, sizeof magic);
    if (!in || std::memcmp(magic, "SQLite format 3", 16) != 0)
      return Error{path_ + " is not a strata store (not an SQLite database)"};
    return {};
  }

  Status open_db(int flags) {
    if (sqlite3_open_v2(path_.c_str(), &db_, flags | SQLITE_OPEN_NOMUTEX, nullptr) != SQLITE_OK) {
      Error e = err("cannot open");
      sqlite3_close_v2(db_);
      db_ = nullptr;
      return e;
    }
    sqlite3_busy_timeout(db_, 5000);
    // Counts the work of every statement (read_work): a callback every kWorkUnit instructions.
    sqlite3_progress_handler(db_, kWorkUnit, [](void* work) {
      ++*static_cast<uint64_t*>(work);
      return 0;  // go on
    }, &work_);
    return {};
  }

  Status check_meta() {
    Stmt s(db_, "SELECT value FROM meta WHERE key='application'");
    if (!s.ok()) {
      std::string why = sqlite3_errmsg(db_);
      if (why.find("no such table") != std::string::npos)
        return Error{path_ + " is not a strata store (an SQLite database without strata's tables)"};
      return Error{path_ + " is not a strata store (unreadable: " + why + ")"};
    }
    if (s.step() != SQLITE_ROW || s.text(0) != "strata")
      return Error{path_ + " is not a strata store (its metadata names another application)"};
    Stmt v(db_, "SELECT value FROM meta WHERE key='schema_version'");
    if (!v.ok() || v.step() != SQLITE_ROW) return Error{path_ + " is a damaged strata store: no schema version"};
    int version = std::atoi(v.text(0).c_str());
    if (version > kSchemaVersion)
      return Error{path_ + " was written by a newer strata (schema " + std::to_string(version) +
                   ", this build reads up to " + std::to_string(kSchemaVersion) + "): upgrade strata"};
    if (version < 1) return Error{path_ + " is a damaged strata store: schema version " + v.text(0)};
    version_ = version;
    // Touch every table we read so a foreign or damaged file fails here, not halfway.
    for (const char* t : {"recordings", "processes", "frames", "stacks", "windows", "stack_counts", "metrics",
                          "communicators", "collectives", "device_activity", "steps", "launch_samples"}) {
      Stmt c(db_, (std::string("SELECT * FROM ") + t + " LIMIT 1").c_str());
      int rc = c.ok() ? c.step() : SQLITE_ERROR;
      if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return Error{path_ + " is a damaged strata store: table " + t + ": " + sqlite3_errmsg(db_)};
    }
    return {};
  }

  // Brings an older file up to kSchemaVersion: every step only adds tables.
  Status migrate() {
    if (version_ >= kSchemaVersion) return {};
    if (auto s = exec("BEGIN IMMEDIATE"); !s) return s;
    if (auto s = exec(kCollectorSchema); !s) return s;
    if (auto s = exec(kDiagnosisSchema); !s) return s;
    Stmt m(db_, "UPDATE meta SET value=? WHERE key='schema_version'");
    m.bind(1, std::to_string(kSchemaVersion));
    if (m.step() != SQLITE_DONE) return err("migrating the schema");
    version_ = kSchemaVersion;
    return exec("COMMIT");
  }

  Status configure() {
    if (auto s = exec("PRAGMA journal_mode=WAL"); !s) return s;
    if (tuning_.cache_kib > 0)
      if (auto s = exec(("PRAGMA cache_size=-" + std::to_string(tuning_.cache_kib)).c_str()); !s) return s;
    if (tuning_.wal_autocheckpoint_pages > 0)
      if (auto s = exec(("PRAGMA wal_autocheckpoint=" + std::to_string(tuning_.wal_autocheckpoint_pages)).c_str()); !s)
        return s;
    return exec("PRAGMA synchronous=NORMAL");
  }

  // read_work()'s unit: often enough to see a few rows' difference, rarely enough to cost nothing
  // (a call per thousand instructions, each a few nanoseconds).
  static constexpr int kWorkUnit = 1000;

  std::string path_;
  SqliteTuning tuning_;
  sqlite3* db_ = nullptr;
  uint64_t work_ = 0;
  // data_version(): what PRAGMA data_version and sqlite3_total_changes64 said at the last call,
  // and the version handed out (the first call hands out 1).
  int64_t seen_data_version_ = -1, seen_total_changes_ = -1;
  uint64_t data_version_ = 0;
  int version_ = 0;
  // A window's sampling rate in SQL (windows w, recordings r): its own, else its recording's.
  std::string window_hz() const {
    return has_fidelity_ ? "CASE WHEN w.sample_hz > 0 THEN w.sample_hz ELSE r.sample_hz END" : "r.sample_hz";
  }

  bool has_identity_ = false;  // the processes table has the pod / container columns
  std::set<std::string> hour_pid_tables_;  // the tables indexed by hour and process (hour_pid_indexes)
  std::set<std::string> missing_;  // "table.column" of catalog columns a read-only older file lacks
  bool has_fidelity_ = false;  // the windows table has sample_hz and unwinding
  std::unordered_map<std::string, int64_t> frame_ids_;
  std::unordered_map<std::string, int64_t> stack_ids_;
  uint64_t cache_resets_ = 0;  // times a full id cache was started over
  std::unique_ptr<Stmt> insert_frame_;
  std::unique_ptr<Stmt> select_frame_;
};

}  // namespace

const char* unwind_method_name(UnwindMethod m) {
  switch (m) {
    case UnwindMethod::kFramePointer: return "fp";
    case UnwindMethod::kDwarf: return "dwarf";
    case UnwindMethod::kMixed: return "mixed";
    case UnwindMethod::kKernelOnly: return "kernel";
  }
  return "unknown";
}

uint64_t sqlite_full_scan_steps() { return g_full_scan_steps.load(std::memory_order_relaxed); }

Result<std::unique_ptr<Store>> Store::open_sqlite(const std::string& path, Mode mode, const SqliteTuning& tuning) {
  auto s = std::make_unique<SqliteStore>(path, tuning);
  if (auto st = s->open(mode); !st) return st.error();
  return std::unique_ptr<Store>(std::move(s));
}

}  // namespace strata::store
