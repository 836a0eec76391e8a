// The cluster store: ClickHouse through its HTTP interface. One MergeTree table per kind of record,
// partitioned by day (retention drops whole partitions), rows inserted as RowBinary. SQL is kept
// to what Debian's ClickHouse 18.16 accepts, which current ClickHouse still does.
//
// Differences from SQLite that callers see:
//  - ids: recordings are numbered by this writer (random 62-bit ids on a cluster, where several
//    collectors write); frames and stacks are named by a hash of their content, so any writer
//    derives the same id for the same stack.
//  - on a cluster (?cluster=NAME) the tables are created on every shard as <table>_local with a
//    Distributed <table> over them; reads and inserts go through the Distributed tables (inserts
//    synchronously), mutations and partition drops to each shard's local tables.
//  - begin/commit buffer the rows and send one INSERT per table on commit. ClickHouse has no
//    multi-table transaction: a crash in the middle of a commit can leave part of it written. For
//    the collector's batches that is repaired: rows carry their batch, and a batch applied again
//    after an interrupted attempt first loses what that attempt wrote (begin_batch).
//  - every row carries the node, so per-node queries need no join (and shard well).
#include <httplib.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "common/clock.h"
#include "store/catalog.h"
#include "store/store.h"

namespace strata::store {
namespace {

// -- the catalog's kinds (store/catalog.h) in ClickHouse. A kind's table is recording_id, node
// (the recording's: rows are sharded and read by it), its columns, and the ingest batch that wrote
// the row. Kinds counted per window (`of_window`: metrics, launch samples) have the window's
// start_ns and end_ns before their columns.
template <typename Row, typename Msg, size_t N>
std::string table_columns(const catalog::Column<Row, Msg> (&columns)[N], bool of_window = false) {
  std::string s = "recording_id Int64, node String";
  if (of_window) s += ", start_ns UInt64, end_ns UInt64";
  for (const auto& c : columns) s += std::string(", ") + c.name + " " + catalog::clickhouse_type(c);
  return s + ", ingest_agent String, ingest_batch UInt64";
}

// The columns an insert into a kind's table names, in the order of its RowBinary rows: a column
// added to an older database is appended after ingest_batch, so the rows cannot rely on its order.
template <typename Row, typename Msg, size_t N>
std::string insert_columns(const catalog::Column<Row, Msg> (&columns)[N], bool of_window = false) {
  std::string s = of_window ? "recording_id, node, start_ns, end_ns" : "recording_id, node";
  for (const auto& c : columns) s += std::string(", ") + c.name;
  return s + ", ingest_agent, ingest_batch";
}

// The rows read by time (a collector's rounds: the span of each job, every few seconds) are sorted
// first by the 10 s bucket of their end (a column ClickHouse fills, `end_10s`): a span's read then
// touches the span's granules only. Sorted by recording and process first, a time range picked no
// granules out, and each round read the day's whole partition: at 1,000 nodes, rounds took 20-35 s
// by a store's fifth job of the day and longer each hour (18.16 does not use a key of intDiv(end,
// ...) for a range on `end`, so the bucket is a column). By the end, as SQLite's index: a span's
// rows are those that end in it, and none ends in the future. 10 s: the agents' default window.
constexpr uint64_t kEndBucketNs = 10'000'000'000ull;
std::string end_bucket(const std::string& end_expr) {
  // DEFAULT, not MATERIALIZED: a Distributed table (a sharded cluster) passes its rows on to the
  // shards' tables with every column, and 18.16 refuses a MATERIALIZED one there.
  return ", end_10s UInt32 DEFAULT intDiv(" + end_expr + ", " + std::to_string(kEndBucketNs) + ")";
}

// Tables, 18.16 syntax. PARTITION BY day of the row's time; ORDER BY what readers filter on.
const std::string kTables[] = {
    R"(recordings (id Int64, node String, command String, started_ns UInt64, ended_ns UInt64, sample_hz UInt32,
       window_s Float64, version UInt64, ingest_agent String, ingest_batch UInt64) ENGINE = ReplacingMergeTree(version)
       PARTITION BY toYYYYMM(toDateTime(intDiv(started_ns, 1000000000))) ORDER BY id)",
    R"(processes (recording_id Int64, node String, pid UInt32, ppid UInt32, start_ns UInt64, comm String,
       command String, job String, rank Int32, local_rank Int32, world_size Int32, version UInt64,
       pod_uid String, container_id String, pod_name String, pod_namespace String, ingest_agent String, ingest_batch UInt64)
       ENGINE = ReplacingMergeTree(version) PARTITION BY toYYYYMMDD(toDateTime(intDiv(start_ns, 1000000000)))
       ORDER BY (recording_id, node, pid, start_ns))",
    R"(frames (id Int64, kind UInt8, build_id String, module String, offset UInt64, function String, file String,
       line Int32) ENGINE = ReplacingMergeTree() ORDER BY id)",
    R"(stacks (id Int64, method UInt8, frame_ids Array(Int64)) ENGINE = ReplacingMergeTree() ORDER BY id)",
    R"(stack_counts (recording_id Int64, node String, start_ns UInt64, end_ns UInt64, kind UInt8, pid UInt32,
       tid UInt32, thread_comm String, stack_id Int64, value UInt64, ingest_agent String, ingest_batch UInt64,
       sample_hz UInt32, unwinding String)" + end_bucket("end_ns") + R"() ENGINE = MergeTree()
       PARTITION BY toYYYYMMDD(toDateTime(intDiv(start_ns, 1000000000))) ORDER BY (end_10s, kind, recording_id, pid, start_ns))",
    "metrics (" + table_columns(catalog::kMetrics, /*of_window=*/true) + end_bucket("end_ns") + R"() ENGINE = MergeTree()
       PARTITION BY toYYYYMMDD(toDateTime(intDiv(start_ns, 1000000000))) ORDER BY (end_10s, name, recording_id, pid, start_ns))",
    "communicators (" + table_columns(catalog::kCommunicators) + R"() ENGINE = MergeTree()
       PARTITION BY toYYYYMMDD(toDateTime(intDiv(init_ns, 1000000000))) ORDER BY (recording_id, pid, init_ns))",
    "collectives (" + table_columns(catalog::kCollectives) + end_bucket("greatest(exit_ns, enter_ns + 1)") + R"() ENGINE = MergeTree()
       PARTITION BY toYYYYMMDD(toDateTime(intDiv(enter_ns, 1000000000))) ORDER BY (end_10s, recording_id, pid, enter_ns))",
    "device_activity (" + table_columns(catalog::kDeviceActivity) + end_bucket("end_ns") + R"() ENGINE = MergeTree()
       PARTITION BY toYYYYMMDD(toDateTime(intDiv(start_ns, 1000000000))) ORDER BY (end_10s, recording_id, pid, start_ns))",
    "steps (" + table_columns(catalog::kSteps) + end_bucket("end_ns") + R"() ENGINE = MergeTree()
       PARTITION BY toYYYYMMDD(toDateTime(intDiv(start_ns, 1000000000))) ORDER BY (end_10s, recording_id, pid, step))",
    "launch_samples (" + table_columns(catalog::kLaunchSamples, /*of_window=*/true) + end_bucket("end_ns") + R"() ENGINE = MergeTree()
       PARTITION BY toYYYYMMDD(toDateTime(intDiv(start_ns, 1000000000))) ORDER BY (end_10s, recording_id, pid, start_ns))",
    R"(agent_stats (recording_id Int64, node String, key String, value Float64, version UInt64, ingest_agent String, ingest_batch UInt64)
       ENGINE = ReplacingMergeTree(version) ORDER BY (recording_id, key))",
    R"(ingest_batches (agent_id String, batch_id UInt64, received_ns UInt64) ENGINE = MergeTree()
       PARTITION BY toYYYYMMDD(toDateTime(intDiv(received_ns, 1000000000))) ORDER BY (agent_id, batch_id))",
    // A batch whose rows are being written: present and not in ingest_batches means an attempt was
    // cut short (the server killed between tables), and its rows are removed before it is applied again.
    R"(ingest_attempts (agent_id String, batch_id UInt64, started_ns UInt64) ENGINE = MergeTree()
       PARTITION BY toYYYYMMDD(toDateTime(intDiv(started_ns, 1000000000))) ORDER BY (agent_id, batch_id))",
    R"(agent_ids (agent_id String, kind UInt8, local_id Int64, store_id Int64, ingest_agent String, ingest_batch UInt64)
       ENGINE = ReplacingMergeTree() ORDER BY (agent_id, kind, local_id))",
    R"(agents (agent_id String, node String, last_seen_ns UInt64, last_batch UInt64, interval_s Float64,
       health String) ENGINE = ReplacingMergeTree(last_seen_ns) ORDER BY agent_id)",
    // The diagnoses `strata serve` keeps: the latest round per job (FINAL / argMax picks it), every
    // round's findings.
    R"(diagnoses (job String, diagnosed_ns UInt64, window_start_ns UInt64, window_end_ns UInt64, ranks UInt32,
       findings UInt32, report_json String, report_text String) ENGINE = ReplacingMergeTree(diagnosed_ns)
       ORDER BY job)",
    R"(findings (job String, diagnosed_ns UInt64, window_start_ns UInt64, window_end_ns UInt64, rank Int32,
       node String, layer String, cause String, culprit String, lost_ms_per_step Float64, confidence Float64,
       evidence String) ENGINE = MergeTree()
       PARTITION BY toYYYYMMDD(toDateTime(intDiv(diagnosed_ns, 1000000000))) ORDER BY (job, rank, cause, diagnosed_ns))",
    // The collectors that share this database, each writing a heartbeat every round: a job is
    // diagnosed by one of the live ones (Store::live_collectors).
    R"(collectors (id String, seen_ns UInt64) ENGINE = ReplacingMergeTree(seen_ns) ORDER BY id)",
    // Jobs with new data that the collector which received it leaves to the job's collector.
    R"(job_marks (job String, marked_ns UInt64) ENGINE = ReplacingMergeTree(marked_ns) ORDER BY job)",
    // A MergeTree, not a TinyLog: collectors that share a cluster open it at the same moment and
    // each writes the schema version when it finds none; TinyLog does not take concurrent inserts
    // (one of them failed with "tmp_sizes.json: File not found" and that collector exited).
    // Duplicate rows from such a race carry the same values and merge away.
    R"(meta (key String, value String) ENGINE = ReplacingMergeTree ORDER BY key)",
};

// On a cluster (clickhouse://...?cluster=NAME) each table above is created on every shard as
// NAME_local, and a Distributed table of the table's own name spreads rows over the shards by this
// key: per-row data by node (a node's rows stay together, a per-rank query reads one shard), frames
// and stacks by their content id (the same stack from two collectors lands on one shard, where
// ReplacingMergeTree merges it), the collector's bookkeeping by agent or job. `meta` stays local.
struct ShardKey {
  const char* table;
  const char* column;
};
const ShardKey kShardKeys[] = {
    {"frames", "id"},       {"stacks", "id"},        {"ingest_batches", "agent_id"}, {"ingest_attempts", "agent_id"},
    {"agent_ids", "agent_id"}, {"agents", "agent_id"}, {"diagnoses", "job"},         {"findings", "job"},
    {"collectors", "id"},   {"job_marks", "job"},
};
std::string shard_key(const std::string& table) {
  for (const auto& k : kShardKeys)
    if (table == k.table) return k.column;
  return "node";
}

// A table's name and the rest of its definition, from a kTables entry.
std::pair<std::string, std::string> split_table(const std::string& def) {
  auto sp = def.find(' ');
  return {def.substr(0, sp), def.substr(sp)};
}

// Columns added to a table after its first release, in the order they were added. A database made
// before gets them by ALTER TABLE ADD COLUMN, which appends them as the CREATE above has them, so
// RowBinary rows line up with either.
struct AddedColumn {
  const char* table;
  const char* name;
  const char* type;
};
const AddedColumn kAddedColumns[] = {
    {"processes", "pod_uid", "String"},
    {"processes", "container_id", "String"},
    {"processes", "pod_name", "String"},
    {"processes", "pod_namespace", "String"},
    // Which ingest batch wrote a row (exactly-once after an interrupted apply; see begin_batch).
    {"recordings", "ingest_agent", "String"},      {"recordings", "ingest_batch", "UInt64"},
    {"processes", "ingest_agent", "String"},       {"processes", "ingest_batch", "UInt64"},
    {"stack_counts", "ingest_agent", "String"},    {"stack_counts", "ingest_batch", "UInt64"},
    {"metrics", "ingest_agent", "String"},         {"metrics", "ingest_batch", "UInt64"},
    {"communicators", "ingest_agent", "String"},   {"communicators", "ingest_batch", "UInt64"},
    {"collectives", "ingest_agent", "String"},     {"collectives", "ingest_batch", "UInt64"},
    {"device_activity", "ingest_agent", "String"}, {"device_activity", "ingest_batch", "UInt64"},
    {"steps", "ingest_agent", "String"},           {"steps", "ingest_batch", "UInt64"},
    {"launch_samples", "ingest_agent", "String"},  {"launch_samples", "ingest_batch", "UInt64"},
    {"agent_stats", "ingest_agent", "String"},     {"agent_stats", "ingest_batch", "UInt64"},
    {"agent_ids", "ingest_agent", "String"},       {"agent_ids", "ingest_batch", "UInt64"},
    // Each window's sampling rate and unwinding (WindowFidelity, issue 19): 0 / '' read as not said.
    {"stack_counts", "sample_hz", "UInt32"},       {"stack_counts", "unwinding", "String"},
};

// The tables whose rows carry the batch that wrote them.
const char* kBatchTables[] = {"recordings", "processes", "stack_counts", "metrics", "communicators", "collectives",
                              "device_activity", "steps", "launch_samples", "agent_stats", "agent_ids"};

// RowBinary: little-endian fixed-width numbers, strings as LEB128 length + bytes.
class RowBinary {
 public:
  template <typename T>
  RowBinary& num(T v) {
    static_assert(std::is_arithmetic_v<T>);
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof v);
    buf_.append(b, sizeof b);
    return *this;
  }
  RowBinary& str(const std::string& s) {
    varint(s.size());
    buf_ += s;
    return *this;
  }
  RowBinary& array_i64(const std::vector<int64_t>& a) {
    varint(a.size());
    for (int64_t v : a) num(v);
    return *this;
  }
  const std::string& data() const { return buf_; }
  bool empty() const { return buf_.empty(); }
  void clear() { buf_.clear(); }

 private:
  void varint(uint64_t v) {
    while (v >= 0x80) {
      buf_ += static_cast<char>((v & 0x7f) | 0x80);
      v >>= 7;
    }
    buf_ += static_cast<char>(v);
  }
  std::string buf_;
};

uint64_t fnv(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Ids from content: positive, so they read the same as Int64 everywhere.
int64_t content_id(const std::string& key) { return static_cast<int64_t>(fnv(key) & 0x7fffffffffffffffull); }

std::string quote(const std::string& s) {
  std::string o = "'";
  for (char c : s) {
    if (c == '\'' || c == '\\') o += '\\';
    o += c;
  }
  return o + "'";
}

// One TabSeparated field: \t \n \\ and friends escaped by ClickHouse; into `o`, whose memory is
// reused from row to row.
void unescape_into(std::string_view f, std::string& o) {
  o.clear();
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '\\' || i + 1 == f.size()) {
      o += f[i];
      continue;
    }
    char c = f[++i];
    switch (c) {
      case 't': o += '\t'; break;
      case 'n': o += '\n'; break;
      case 'r': o += '\r'; break;
      case '0': o += '\0'; break;
      case 'b': o += '\b'; break;
      case 'f': o += '\f'; break;
      default: o += c;
    }
  }
}

using Row = std::vector<std::string>;

uint64_t u64(const std::string& s) { return std::strtoull(s.c_str(), nullptr, 10); }
int64_t i64(const std::string& s) { return std::strtoll(s.c_str(), nullptr, 10); }
double dbl(const std::string& s) { return std::strtod(s.c_str(), nullptr); }

// A row's columns in RowBinary, each as its ClickHouse type (clickhouse_type).
template <typename Row, typename Msg, size_t N>
void put_row(RowBinary& b, const catalog::Column<Row, Msg> (&columns)[N], const Row& r) {
  for (const auto& c : columns) {
    std::visit(
        [&](auto m) {
          using T = catalog::MemberType<Row, decltype(m)>;
          if constexpr (std::is_same_v<T, std::string>) b.str(r.*m);
          else if constexpr (std::is_same_v<T, bool>) b.num(static_cast<uint8_t>(r.*m ? 1 : 0));
          else if constexpr (std::is_same_v<T, int>) b.num(static_cast<int32_t>(r.*m));
          else b.num(r.*m);
        },
        c.member);
  }
}

// Reads a row's columns from TabSeparated field `first` on; returns the next field.
template <typename Row, typename Msg, size_t N>
size_t read_row(const std::vector<std::string>& f, size_t first, const catalog::Column<Row, Msg> (&columns)[N], Row& r) {
  size_t i = first;
  for (const auto& c : columns) {
    std::visit(
        [&](auto m) {
          using T = catalog::MemberType<Row, decltype(m)>;
          if constexpr (std::is_same_v<T, std::string>) r.*m = f[i];
          else if constexpr (std::is_same_v<T, double>) r.*m = dbl(f[i]);
          else if constexpr (std::is_same_v<T, bool>) r.*m = u64(f[i]) != 0;
          else if constexpr (std::is_signed_v<T>) r.*m = static_cast<T>(i64(f[i]));
          else r.*m = static_cast<T>(u64(f[i]));
        },
        c.member);
    ++i;
  }
  return i;
}

class ClickHouseStore final : public Store {
 public:
  ClickHouseStore(std::string host, int port, std::string db, std::string cluster)
      : host_(std::move(host)), port_(port), db_(std::move(db)), cluster_(std::move(cluster)), cli_(host_, port_) {
    configure(cli_);
  }

  static void configure(httplib::Client& c) {
    c.set_connection_timeout(5, 0);
    c.set_read_timeout(300, 0);
    c.set_write_timeout(300, 0);
    c.set_keep_alive(true);
    // A request's headers and body leave in two writes: with Nagle's algorithm the body waits for
    // the server's delayed ACK, 40 ms per statement (half a second per ingest batch).
    c.set_tcp_nodelay(true);
  }

  Status open(Mode mode) {
    auto v = query("SELECT version()");
    if (!v) return v.error().environment();
    if (!cluster_.empty()) {
      if (auto st = find_shards(); !st) return st;
    }
    if (mode == Mode::kReadOnly) {
      auto t = query("SELECT value FROM " + db_ + ".meta WHERE key = 'schema_version'");
      if (!t) return Error{"clickhouse " + db_ + ": not a strata database (" + t.error().message + ")"};
    } else if (cluster_.empty()) {
      if (auto st = exec("CREATE DATABASE IF NOT EXISTS " + db_); !st) return st;
      for (const std::string& t : kTables) {
        if (auto st = exec(std::string("CREATE TABLE IF NOT EXISTS ") + db_ + "." + t); !st) return st;
      }
    } else {
      if (auto st = create_on_shards(); !st) return st;
    }
    if (auto st = added_columns(mode != Mode::kReadOnly); !st) return st;
    if (!cluster_.empty() && mode != Mode::kReadOnly) {
      // meta is each server's own: every shard gets it, so any of them opens as a strata database.
      for (auto& [server, name] : servers()) {
        auto m = query_at(*server, "SELECT count() FROM " + db_ + ".meta WHERE key = 'schema_version'");
        if (!m) return m.error();
        if (!m->empty() && u64((*m)[0][0]) > 0) continue;
        auto res = server->Post("/", "INSERT INTO " + db_ + ".meta VALUES ('application', 'strata'), ('schema_version', '" +
                                         std::to_string(kSchemaVersion) + "')", "text/plain");
        if (!res || res->status != 200) return err(name + ": writing meta", res);
      }
    }
    auto meta = query("SELECT value FROM " + db_ + ".meta WHERE key = 'schema_version'");
    if (!meta) return meta.error();
    if (meta->empty()) {
      if (auto st = exec("INSERT INTO " + db_ + ".meta VALUES ('application', 'strata'), ('schema_version', '" +
                         std::to_string(kSchemaVersion) + "')");
          !st)
        return st;
    } else if (std::atoi((*meta)[0][0].c_str()) > kSchemaVersion) {
      return Error{"clickhouse " + db_ + " was written by a newer strata (schema " + (*meta)[0][0] + "): upgrade strata"};
    }
    auto rec = query("SELECT id, node FROM " + db_ + ".recordings");
    if (!rec) return rec.error();
    for (const auto& r : *rec) {
      recording_nodes_[i64(r[0])] = r[1];
      next_recording_ = std::max(next_recording_, i64(r[0]) + 1);
    }
    return {};
  }

  // The cluster's shards, from system.clusters of the server named in the URL (one per shard: its
  // first replica; with replicated tables the replicas copy each other). Each is reached on the
  // URL's HTTP port: a cluster's servers share one configuration.
  Status find_shards() {
    auto rows = query("SELECT host_address FROM system.clusters WHERE cluster = " + quote(cluster_) +
                      " AND replica_num = 1 ORDER BY shard_num");
    if (!rows) return rows.error();
    if (rows->empty())
      return Error{"clickhouse " + host_ + ":" + std::to_string(port_) + ": no cluster '" + cluster_ +
                   "' in system.clusters (define it under remote_servers in every server's configuration)"}
          .environment();
    for (const auto& r : *rows) {
      shards_.push_back(std::make_unique<httplib::Client>(r[0], port_));
      configure(*shards_.back());
      shard_hosts_.push_back(r[0]);
    }
    return {};
  }

  // Runs one statement on every shard (DDL and mutations reach the local tables, which a
  // Distributed table does not forward them to; ON CLUSTER would need ZooKeeper).
  Status exec_on_shards(const std::string& sql) {
    for (size_t i = 0; i < shards_.size(); ++i) {
      auto res = shards_[i]->Post("/", sql, "text/plain");
      if (!res || res->status != 200) return err("shard " + shard_hosts_[i] + ": " + sql.substr(0, 60), res);
    }
    return {};
  }

  // Every shard gets the local tables and the Distributed tables over them (the same names on
  // every server, so the collector may write through any of them).
  Status create_on_shards() {
    if (auto st = exec_on_shards("CREATE DATABASE IF NOT EXISTS " + db_); !st) return st;
    for (const std::string& t : kTables) {
      auto [name, def] = split_table(t);
      if (name == "meta") {
        if (auto st = exec_on_shards("CREATE TABLE IF NOT EXISTS " + db_ + "." + t); !st) return st;
        continue;
      }
      if (auto st = exec_on_shards("CREATE TABLE IF NOT EXISTS " + db_ + "." + name + "_local" + def); !st) return st;
      if (auto st = exec_on_shards("CREATE TABLE IF NOT EXISTS " + db_ + "." + name + " AS " + db_ + "." + name +
                                   "_local ENGINE = Distributed(" + cluster_ + ", " + db_ + ", " + name +
                                   "_local, cityHash64(" + shard_key(name) + "))");
          !st)
        return st;
    }
    return {};
  }

  // The table that holds a table's rows on one server: itself, or its local half on a cluster.
  std::string local_table(const std::string& table) const { return cluster_.empty() ? table : table + "_local"; }

  // Adds the columns an older database lacks (when writing); notes which it has (a read-only look
  // at an older database reads them empty).
  Status added_columns(bool add) {
    auto cols = query("SELECT table, name FROM system.columns WHERE database = " + quote(db_));
    if (!cols) return cols.error();
    for (const auto& r : *cols) columns_.insert({r[0], r[1]});
    // The hand-listed ones, then the catalog's kinds' (store/catalog.h): any column of a kind that
    // an older database's table lacks.
    std::vector<AddedColumn> to_add(std::begin(kAddedColumns), std::end(kAddedColumns));
    catalog::for_each_kind([&](const char* table, const auto& columns) {
      for (const auto& c : columns) to_add.push_back({table, c.name, catalog::clickhouse_type(c)});
    });
    for (const auto& c : to_add) {
      if (columns_.count({c.table, c.name}) || !add) continue;
      const std::string add = std::string(" ADD COLUMN ") + c.name + " " + c.type;
      if (cluster_.empty()) {
        if (auto st = exec("ALTER TABLE " + db_ + "." + c.table + add); !st) return st;
      } else {
        // The local half first: the Distributed table reads columns the shards have.
        if (auto st = exec_on_shards("ALTER TABLE " + db_ + "." + c.table + "_local" + add); !st) return st;
        if (auto st = exec_on_shards("ALTER TABLE " + db_ + "." + c.table + add); !st) return st;
      }
      columns_.insert({c.table, c.name});
    }
    return {};
  }

  // "pid, step, ...": the columns of a read of `table` (select() adds the node); a column a
  // read-only look at an older database lacks reads as its default.
  template <typename Row, typename Msg, size_t N>
  std::string select_columns(const std::string& table, const catalog::Column<Row, Msg> (&columns)[N]) const {
    std::string s;
    for (const auto& c : columns) {
      s += s.empty() ? "" : ", ";
      s += columns_.count({table, c.name}) ? std::string(c.name) : catalog::default_literal(c);
    }
    return s;
  }

  // The end buckets (end_10s) a span's rows lie in: rows that end after `from` and start before
  // `to` end before to + kMaxRowSpanNs. Nothing where the table lacks the column (a database made
  // before it: its reads go by time alone, as they did).
  std::string end_buckets(const std::string& table, std::optional<uint64_t> from, std::optional<uint64_t> to) const {
    if (!columns_.count({table, "end_10s"})) return "";
    std::string w;
    if (from) w += " AND end_10s >= " + std::to_string(*from / kEndBucketNs);
    if (to) w += " AND end_10s <= " + std::to_string((*to > UINT64_MAX - kMaxRowSpanNs ? UINT64_MAX : *to + kMaxRowSpanNs) / kEndBucketNs);
    return w;
  }

  // A column's name for a SELECT, or an empty string literal when this database lacks it.
  std::string column_or_empty(const std::string& table, const std::string& name) const {
    return columns_.count({table, name}) ? name : "''";
  }

  // Deletes what an interrupted attempt at a batch left. ALTER TABLE DELETE is a mutation that
  // ClickHouse runs in the background (18.16 has no synchronous form): wait until system.mutations
  // says it is done, so the rows written next are not deleted with them. Only tables that hold rows
  // of the batch are touched (a mutation rewrites a table's parts).
  Status remove_batch_rows(const std::string& agent, uint64_t batch_id) {
    std::string match = " WHERE ingest_agent = " + quote(agent) + " AND ingest_batch = " + std::to_string(batch_id);
    std::string count_sql;
    for (const char* t : kBatchTables)
      count_sql += std::string(count_sql.empty() ? "" : " UNION ALL ") + "SELECT '" + t + "', count() FROM " + db_ +
                   "." + t + match;
    auto counts = query(count_sql);
    if (!counts) return counts.error();
    std::vector<std::string> tables;
    for (const auto& r : *counts)
      if (r.size() == 2 && u64(r[1]) > 0) tables.push_back(r[0]);
    if (tables.empty()) return {};
    // On a cluster the mutation goes to each shard's local table: ClickHouse refuses ALTER DELETE
    // on a Distributed one.
    for (auto& [server, name] : servers()) {
      for (const auto& t : tables) {
        auto res = server->Post("/", "ALTER TABLE " + db_ + "." + local_table(t) + " DELETE" + match, "text/plain");
        if (!res || res->status != 200) return err(name + ": deleting an interrupted batch's rows", res);
      }
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    for (auto& [server, name] : servers()) {
      while (true) {
        auto left = query_at(*server, "SELECT count() FROM system.mutations WHERE database = " + quote(db_) + " AND is_done = 0");
        if (!left) return left.error();
        if (!left->empty() && u64((*left)[0][0]) == 0) break;
        if (std::chrono::steady_clock::now() > deadline)
          return Error{"clickhouse " + name + " " + db_ +
                       ": removing the rows of an interrupted batch takes over 120 s (see system.mutations)"};
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    return {};
  }

  // Drops the daily partitions older than `days` (MergeTree tables partitioned by day), on every
  // shard of a cluster (system.parts lists a server's own tables: the local halves).
  Status apply_retention(unsigned days) {
    auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    now -= static_cast<time_t>(days) * 86400;
    tm t{};
    gmtime_r(&now, &t);
    char cutoff[16];
    strftime(cutoff, sizeof cutoff, "%Y%m%d", &t);
    for (auto& [server, name] : servers()) {
      auto parts = query_at(*server, "SELECT DISTINCT table, partition FROM system.parts WHERE database = " +
                                         quote(db_) + " AND active AND length(partition) = 8 AND partition < " + quote(cutoff));
      if (!parts) return parts.error();
      for (const auto& p : *parts) {
        auto res = server->Post("/", "ALTER TABLE " + db_ + "." + p[0] + " DROP PARTITION " + p[1], "text/plain");
        if (!res || res->status != 200) return err(name + ": dropping partition " + p[1] + " of " + p[0], res);
      }
    }
    return {};
  }

  // The servers that hold this database's rows: the one of the URL, or every shard of the cluster.
  std::vector<std::pair<httplib::Client*, std::string>> servers() {
    std::vector<std::pair<httplib::Client*, std::string>> out;
    if (cluster_.empty()) {
      out.emplace_back(&cli_, host_ + ":" + std::to_string(port_));
    } else {
      for (size_t i = 0; i < shards_.size(); ++i)
        out.emplace_back(shards_[i].get(), shard_hosts_[i] + ":" + std::to_string(port_));
    }
    return out;
  }

  // -- writing: buffered per table, sent on commit
  Result<int64_t> begin_recording(const RecordingInfo& r) override {
    // Collectors that share a cluster number recordings independently: a random 62-bit id there
    // (two collide with odds of about n^2 / 2^63), the next number on a database of its own.
    int64_t id = cluster_.empty() ? next_recording_++ : random_id();
    recording_nodes_[id] = r.node;
    recordings_[id] = r;
    buffer_recording(id, 0);
    return id;
  }

  Status end_recording(int64_t recording, uint64_t ended_ns) override {
    auto it = recordings_.find(recording);
    if (it == recordings_.end()) {
      auto rows = query("SELECT node, command, started_ns, sample_hz, window_s FROM " + db_ +
                        ".recordings FINAL WHERE id = " + std::to_string(recording));
      if (!rows) return rows.error();
      if (rows->empty()) return Error{"clickhouse: no recording " + std::to_string(recording)};
      RecordingInfo info{(*rows)[0][0], (*rows)[0][1], u64((*rows)[0][2]),
                         static_cast<unsigned>(u64((*rows)[0][3])), dbl((*rows)[0][4])};
      it = recordings_.emplace(recording, info).first;
    }
    buffer_recording(recording, ended_ns);
    return {};
  }

  Status put_process(int64_t recording, const ProcessInfo& p) override {
    buf("processes").num(recording).str(p.node).num(p.pid).num(p.ppid).num(p.start_ns).str(p.comm).str(p.command)
        .str(p.job).num(static_cast<int32_t>(p.rank)).num(static_cast<int32_t>(p.local_rank))
        .num(static_cast<int32_t>(p.world_size)).num(version()).str(p.pod_uid).str(p.container_id).str(p.pod_name)
        .str(p.pod_namespace);
    tag(buf("processes"));
    return {};
  }

  Result<int64_t> intern_stack(const Stack& stack, UnwindMethod method) override {
    // The ids written already, so each frame and stack is sent once; past this many a set starts
    // over (~40 MB each): writing one again is harmless, ReplacingMergeTree keeps one row per id.
    constexpr size_t kMaxKnownIds = 1u << 20;
    if (known_frames_.size() >= kMaxKnownIds) known_frames_.clear();
    if (known_stacks_.size() >= kMaxKnownIds) known_stacks_.clear();
    std::vector<int64_t> ids;
    ids.reserve(stack.size());
    std::string skey(1, static_cast<char>(method));
    for (const auto& f : stack) {
      std::string key = std::to_string(static_cast<int>(f.kind)) + '\0' + f.build_id + '\0' + f.module + '\0' +
                        std::to_string(f.offset);
      if (f.kind == FrameKind::kPython || f.kind == FrameKind::kCuda) key += '\0' + f.function + '\0' + f.file;
      int64_t id = content_id(key);
      if (known_frames_.insert(id).second) {
        buf("frames").num(id).num(static_cast<uint8_t>(f.kind)).str(f.build_id).str(f.module).num(f.offset)
            .str(f.function).str(f.file).num(static_cast<int32_t>(f.line));
      }
      ids.push_back(id);
      skey.append(reinterpret_cast<const char*>(&id), sizeof id);
    }
    int64_t sid = content_id(skey);
    if (known_stacks_.insert(sid).second) buf("stacks").num(sid).num(static_cast<uint8_t>(method)).array_i64(ids);
    return sid;
  }

  Status put_window(int64_t rec, uint64_t start_ns, uint64_t end_ns, CountKind kind,
                    const std::vector<StackCount>& counts, const WindowFidelity& fidelity) override {
    auto& b = buf("stack_counts");
    const std::string& node = node_of(rec);
    for (const auto& c : counts)
      b.num(rec).str(node).num(start_ns).num(end_ns).num(static_cast<uint8_t>(kind)).num(c.pid).num(c.tid)
          .str(c.thread_comm).num(c.stack_id).num(c.value).str(batch_agent_).num(batch_id_)
          .num(static_cast<uint32_t>(fidelity.sample_hz)).str(fidelity.unwinding);
    return {};
  }

  Status put_stat(int64_t rec, const std::string& key, double value) override {
    tag(buf("agent_stats").num(rec).str(node_of(rec)).str(key).num(value).num(version()));
    return {};
  }

  Status put_metrics(int64_t rec, uint64_t start_ns, uint64_t end_ns, const std::vector<Metric>& metrics) override {
    return put_window_rows("metrics", catalog::kMetrics, rec, start_ns, end_ns, metrics);
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

  // Adds rows of a catalog kind counted per window (`of_window`) to its table's buffer.
  template <typename Row, typename Msg, size_t N>
  Status put_window_rows(const char* table, const catalog::Column<Row, Msg> (&columns)[N], int64_t rec,
                         uint64_t start_ns, uint64_t end_ns, const std::vector<Row>& rows) {
    auto& b = buf(table);
    const std::string& node = node_of(rec);
    for (const auto& r : rows) {
      b.num(rec).str(node).num(start_ns).num(end_ns);
      put_row(b, columns, r);
      tag(b);
    }
    return {};
  }

  // Adds rows of a catalog kind (store/catalog.h) to its table's buffer.
  template <typename Row, typename Msg, size_t N>
  Status put_rows(const char* table, const catalog::Column<Row, Msg> (&columns)[N], int64_t rec,
                  const std::vector<Row>& rows) {
    auto& b = buf(table);
    const std::string& node = node_of(rec);
    for (const auto& r : rows) {
      b.num(rec).str(node);
      put_row(b, columns, r);
      tag(b);
    }
    return {};
  }

  Status put_launch_samples(int64_t rec, uint64_t start_ns, uint64_t end_ns,
                            const std::vector<LaunchSample>& rows) override {
    return put_window_rows("launch_samples", catalog::kLaunchSamples, rec, start_ns, end_ns, rows);
  }

  // Frames arrive symbolized from the agents; nothing to do here.
  Result<std::vector<FrameRow>> unsymbolized_frames() override { return std::vector<FrameRow>{}; }
  Status update_frame_symbols(const std::vector<FrameRow>&) override { return {}; }

  Status begin() override { return {}; }

  Status commit() override {
    // The bookkeeping tables go last: a batch is marked applied only after its rows are in.
    // The attempt goes first: whatever follows of a batch can be found and removed if the server
    // dies before ingest_batches says the batch is in.
    static const char* kOrder[] = {"ingest_attempts", "recordings", "processes", "frames", "stacks", "stack_counts",
                                   "metrics", "communicators", "collectives", "device_activity", "steps",
                                   "launch_samples", "agent_stats", "agent_ids", "ingest_batches", "agents"};
    // A test failpoint: the process dies after this many table inserts, as a kill between tables
    // would leave it.
    static const long die_after = [] {
      const char* v = std::getenv("STRATA_FAILPOINT_CLICKHOUSE_DIE_AFTER_INSERTS");
      return v ? std::atol(v) : 0;
    }();
    for (const char* t : kOrder) {
      auto it = buffers_.find(t);
      if (it == buffers_.end() || it->second.empty()) continue;
      if (auto st = insert(t, it->second.data()); !st) {
        (void)rollback();
        return st;
      }
      it->second.clear();
      if (die_after > 0 && ++failpoint_inserts_ >= die_after) _exit(137);
    }
    buffers_.clear();
    applied_pending_.clear();
    prepared_.clear();
    attempted_.clear();
    batch_agent_.clear();
    batch_id_ = 0;
    return {};
  }

  // Exactly once without transactions: the batch's rows carry (agent, batch id); an attempt is
  // recorded before them and the batch is marked applied after them. A batch with an attempt but
  // no mark was cut short: its rows are deleted (a mutation, waited for) before it is written again.
  Status begin_batch(const std::string& agent, uint64_t batch_id) override {
    batch_agent_ = agent;
    batch_id_ = batch_id;
    if (prepared_.count({agent, batch_id}) && !attempted_.count({agent, batch_id})) {
      buf("ingest_attempts").str(agent).num(batch_id).num(wall_clock_ns());
      return {};
    }
    auto r = query("SELECT count() FROM " + db_ + ".ingest_attempts WHERE agent_id = " + quote(agent) +
                   " AND batch_id = " + std::to_string(batch_id));
    if (!r) return r.error();
    if (!r->empty() && u64((*r)[0][0]) > 0) {
      if (auto st = remove_batch_rows(agent, batch_id); !st) return st;
    }
    buf("ingest_attempts").str(agent).num(batch_id).num(wall_clock_ns());
    return {};
  }

  Status rollback() override {
    buffers_.clear();
    batch_agent_.clear();
    batch_id_ = 0;
    // Ids the buffers named may not exist: learn them again.
    known_frames_.clear();
    known_stacks_.clear();
    for (const auto& k : applied_pending_) applied_.erase(k);
    applied_pending_.clear();
    prepared_.clear();
    attempted_.clear();
    return {};
  }

  Status prepare_batches(const std::vector<std::pair<std::string, uint64_t>>& batches) override {
    prepared_.clear();
    attempted_.clear();
    std::string list;
    for (const auto& [agent, id] : batches) {
      if (applied_.count({agent, id})) continue;
      list += (list.empty() ? "(" : ", (") + quote(agent) + ", " + std::to_string(id) + ")";
    }
    if (list.empty()) return {};
    const std::string in = " WHERE (agent_id, batch_id) IN (" + list + ")";
    auto applied = query("SELECT DISTINCT agent_id, batch_id FROM " + db_ + ".ingest_batches" + in);
    if (!applied) return applied.error();
    auto attempted = query("SELECT DISTINCT agent_id, batch_id FROM " + db_ + ".ingest_attempts" + in);
    if (!attempted) return attempted.error();
    if (applied_.size() > 100000) applied_.clear();
    for (const auto& r : *applied) applied_.insert({r[0], u64(r[1])});
    for (const auto& r : *attempted) attempted_.insert({r[0], u64(r[1])});
    for (const auto& b : batches) prepared_.insert(b);
    return {};
  }

  Result<bool> batch_applied(const std::string& agent, uint64_t batch_id) override {
    if (applied_.count({agent, batch_id})) return true;
    if (prepared_.count({agent, batch_id})) return false;  // read with its group (prepare_batches)
    auto r = query("SELECT count() FROM " + db_ + ".ingest_batches WHERE agent_id = " + quote(agent) +
                   " AND batch_id = " + std::to_string(batch_id));
    if (!r) return r.error();
    return !r->empty() && u64((*r)[0][0]) > 0;
  }

  Status mark_batch_applied(const std::string& agent, uint64_t batch_id, uint64_t received_ns) override {
    buf("ingest_batches").str(agent).num(batch_id).num(received_ns);
    // Remembered in memory (bounded): a resend right after is refused without a query.
    if (applied_.size() > 100000) applied_.clear();
    applied_.insert({agent, batch_id});
    applied_pending_.push_back({agent, batch_id});
    return {};
  }

  Result<std::vector<std::pair<int64_t, int64_t>>> agent_ids(const std::string& agent, AgentIdKind kind) override {
    auto r = query("SELECT local_id, any(store_id) FROM " + db_ + ".agent_ids WHERE agent_id = " + quote(agent) +
                   " AND kind = " + std::to_string(static_cast<int>(kind)) + " GROUP BY local_id");
    if (!r) return r.error();
    std::vector<std::pair<int64_t, int64_t>> out;
    for (const auto& row : *r) out.emplace_back(i64(row[0]), i64(row[1]));
    return out;
  }

  Result<std::optional<int64_t>> agent_id(const std::string& agent, AgentIdKind kind, int64_t local_id) override {
    auto r = query("SELECT any(store_id) FROM " + db_ + ".agent_ids WHERE agent_id = " + quote(agent) + " AND kind = " +
                   std::to_string(static_cast<int>(kind)) + " AND local_id = " + std::to_string(local_id) +
                   " GROUP BY local_id");
    if (!r) return r.error();
    if (r->empty()) return std::optional<int64_t>{};
    return std::optional<int64_t>{i64((*r)[0][0])};
  }

  Result<std::vector<std::pair<int64_t, int64_t>>> recent_agent_ids(const std::string& agent, AgentIdKind kind,
                                                                    size_t limit) override {
    auto r = query("SELECT local_id, any(store_id) FROM " + db_ + ".agent_ids WHERE agent_id = " + quote(agent) +
                   " AND kind = " + std::to_string(static_cast<int>(kind)) + " GROUP BY local_id ORDER BY local_id DESC LIMIT " +
                   std::to_string(limit));
    if (!r) return r.error();
    std::vector<std::pair<int64_t, int64_t>> out;
    for (const auto& row : *r) out.emplace_back(i64(row[0]), i64(row[1]));
    return out;
  }

  Status put_agent_id(const std::string& agent, AgentIdKind kind, int64_t local_id, int64_t store_id) override {
    tag(buf("agent_ids").str(agent).num(static_cast<uint8_t>(kind)).num(local_id).num(store_id));
    return {};
  }

  Status put_agent_status(const AgentStatus& a) override {
    buf("agents").str(a.agent_id).str(a.node).num(a.last_seen_ns).num(a.last_batch).num(a.interval_s).str(a.health_json);
    return {};
  }

  Result<std::vector<AgentStatus>> agents() override {
    auto r = query("SELECT agent_id, argMax(node, last_seen_ns), max(last_seen_ns), argMax(last_batch, last_seen_ns),"
                   " argMax(interval_s, last_seen_ns), argMax(health, last_seen_ns) FROM " + db_ +
                   ".agents GROUP BY agent_id ORDER BY 2, 1");
    if (!r) return r.error();
    std::vector<AgentStatus> out;
    for (const auto& row : *r) out.push_back({row[0], row[1], u64(row[2]), u64(row[3]), dbl(row[4]), row[5]});
    return out;
  }

  // Sent at once, not with the next commit: the diagnoser is not the ingest path. Findings first, so
  // a round is never the latest without its findings.
  Status put_diagnosis(const KeptDiagnosis& d, const std::vector<KeptFinding>& findings) override {
    if (!findings.empty()) {
      RowBinary f;
      for (const auto& x : findings)
        f.str(x.job).num(x.diagnosed_ns).num(x.window_start_ns).num(x.window_end_ns).num(static_cast<int32_t>(x.rank))
            .str(x.node).str(x.layer).str(x.cause).str(x.culprit).num(x.lost_ms_per_step).num(x.confidence)
            .str(x.evidence_json);
      if (auto st = insert("findings", f.data()); !st) return st;
    }
    RowBinary r;
    r.str(d.job).num(d.diagnosed_ns).num(d.window_start_ns).num(d.window_end_ns).num(d.ranks).num(d.findings)
        .str(d.report_json).str(d.report_text);
    return insert("diagnoses", r.data());
  }

  Result<std::vector<KeptDiagnosis>> kept_diagnoses(const std::string* job) override {
    auto r = query("SELECT job, max(diagnosed_ns), argMax(window_start_ns, diagnosed_ns), argMax(window_end_ns, diagnosed_ns),"
                   " argMax(ranks, diagnosed_ns), argMax(findings, diagnosed_ns), argMax(report_json, diagnosed_ns),"
                   " argMax(report_text, diagnosed_ns) FROM " + db_ + ".diagnoses" +
                   (job ? " WHERE job = " + quote(*job) : std::string()) + " GROUP BY job ORDER BY job");
    std::vector<KeptDiagnosis> out;
    if (!r) return missing_table(r.error()) ? Result<std::vector<KeptDiagnosis>>(out) : r.error();
    for (const auto& row : *r) {
      KeptDiagnosis d;
      d.job = row[0];
      d.diagnosed_ns = u64(row[1]);
      d.window_start_ns = u64(row[2]);
      d.window_end_ns = u64(row[3]);
      d.ranks = static_cast<uint32_t>(u64(row[4]));
      d.findings = static_cast<uint32_t>(u64(row[5]));
      d.report_json = row[6];
      d.report_text = row[7];
      out.push_back(std::move(d));
    }
    return out;
  }

  Result<std::vector<FindingHistory>> finding_history(const std::string& job) override {
    auto r = query("SELECT rank, argMax(node, diagnosed_ns), argMax(layer, diagnosed_ns), cause,"
                   " argMax(culprit, diagnosed_ns), max(diagnosed_ns) AS last_seen, min(diagnosed_ns), min(window_start_ns),"
                   " count(), max(lost_ms_per_step) AS max_lost FROM " + db_ + ".findings WHERE job = " + quote(job) +
                   " GROUP BY rank, cause ORDER BY last_seen DESC, max_lost DESC");
    std::vector<FindingHistory> out;
    if (!r) return missing_table(r.error()) ? Result<std::vector<FindingHistory>>(out) : r.error();
    for (const auto& row : *r) {
      FindingHistory h;
      h.rank = static_cast<int>(i64(row[0]));
      h.node = row[1];
      h.layer = row[2];
      h.cause = row[3];
      h.culprit = row[4];
      h.last_seen_ns = u64(row[5]);
      h.first_seen_ns = u64(row[6]);
      h.first_window_start_ns = u64(row[7]);
      h.rounds = u64(row[8]);
      h.max_lost_ms_per_step = dbl(row[9]);
      out.push_back(std::move(h));
    }
    return out;
  }

  // -- reading
  // One profile's samples as its rows come (load_profile, load_profiles): one sample per (node,
  // process, thread, stack, period), counts summed, each stack indexed once in its first row's order.
  struct SampleMerger {
    std::map<int64_t, uint32_t> index;  // stack id -> index into the profile's stacks
    std::vector<int64_t> stack_ids;
    std::map<std::tuple<std::string, uint32_t, uint32_t, std::string, int64_t, uint64_t>, size_t> merged;
    void add(Profile& p, ProfileSample s, int64_t stack_id) {
      auto [it, inserted] = index.emplace(stack_id, static_cast<uint32_t>(stack_ids.size()));
      if (inserted) stack_ids.push_back(stack_id);
      s.stack_index = it->second;
      auto key = std::make_tuple(s.node, s.pid, s.tid, s.comm, stack_id, s.period_ns);
      if (auto m = merged.find(key); m != merged.end()) {
        p.samples[m->second].count += s.count;
        return;
      }
      merged.emplace(std::move(key), p.samples.size());
      p.samples.push_back(std::move(s));
    }
  };

  // A row's rate: its window's, else (a row written before windows said) its recording's, from
  // `rates`, which is read whole the first time one is needed.
  Result<uint64_t> row_hz(uint64_t window_hz, int64_t recording, std::optional<std::map<int64_t, unsigned>>& rates) {
    if (window_hz != 0) return window_hz;
    if (!rates) {
      auto all = recording_rates();
      if (!all) return all.error();
      rates = std::move(*all);
    }
    return static_cast<uint64_t>((*rates)[recording]);
  }

  Result<Profile> load_profile(const ProfileFilter& f) override {
    Profile p;
    p.kind = f.kind == CountKind::kOnCpu ? "oncpu" : "offcpu";
    p.value_unit = f.kind == CountKind::kOnCpu ? "count" : "microseconds";
    const bool span = f.from_ns || f.to_ns;
    // One node's profile: its recordings. By their ids too, which lead the tables' sort key after
    // the kind: a filter on the node alone read every node's rows of the span, and a collector's
    // round at 8,000 ranks reads the past of each of 1,000 nodes (ClickHouse answered each in a
    // few ms, 20-30 s a round, with ingest waiting behind it).
    const std::string node_recordings =
        f.node && !f.recording ? " AND recording_id IN (SELECT id FROM " + db_ + ".recordings WHERE node = " + quote(*f.node) + ")"
                               : std::string();
    std::string rw = f.recording ? " WHERE id = " + std::to_string(*f.recording) : "";
    if (f.node) rw += std::string(rw.empty() ? " WHERE " : " AND ") + "node = " + quote(*f.node);
    if (!span) {
      // The recordings' span and rate. A profile of a span has the span of its windows, read below
      // with the rate: one round trip fewer per node and kind a round.
      auto rec = query("SELECT min(started_ns), max(greatest(ended_ns, started_ns)), max(sample_hz), count() FROM " +
                       db_ + ".recordings FINAL" + rw);
      if (!rec) return rec.error();
      if (!rec->empty() && u64((*rec)[0][3]) > 0) {
        p.start_ns = u64((*rec)[0][0]);
        p.duration_ns = u64((*rec)[0][1]) - p.start_ns;
        uint64_t hz = u64((*rec)[0][2]);
        p.period_ns = hz ? 1'000'000'000ull / hz : 0;
      }
    }
    // Samples per (node, pid, thread, stack): pids repeat across nodes.
    std::string filter = " WHERE kind = " + std::to_string(static_cast<int>(f.kind));
    if (f.node) filter += " AND node = " + quote(*f.node) + node_recordings;
    if (f.pid) filter += " AND pid = " + std::to_string(*f.pid);
    if (f.tid) filter += " AND tid = " + std::to_string(*f.tid);
    if (f.recording) filter += " AND recording_id = " + std::to_string(*f.recording);
    if (f.rank || f.job)
      filter += " AND (recording_id, pid) IN (SELECT recording_id, pid FROM " + db_ + ".processes WHERE 1 = 1" +
                (f.rank ? " AND rank = " + std::to_string(*f.rank) : std::string()) + (f.job ? " AND job = " + quote(*f.job) : std::string()) +
                ")";
    if (f.from_ns || f.to_ns) {
      // The windows that overlap [from, to) (each row carries its window); the profile then spans them.
      std::string range;
      if (f.from_ns) {
        range += " AND end_ns > " + std::to_string(*f.from_ns);
        range += " AND start_ns >= " + std::to_string(*f.from_ns > kMaxRowSpanNs ? *f.from_ns - kMaxRowSpanNs : 0);
      }
      if (f.to_ns) range += " AND start_ns < " + std::to_string(*f.to_ns);
      range += end_buckets("stack_counts", f.from_ns, f.to_ns);
      std::string rw2 = f.recording ? " AND recording_id = " + std::to_string(*f.recording) : "";
      // One node's profile spans that node's windows (as SQLite's does): other nodes' windows start
      // elsewhere.
      if (f.node && !f.recording) rw2 += " AND node = " + quote(*f.node) + node_recordings;
      auto windows = query("SELECT min(start_ns), max(end_ns), count(), (SELECT max(sample_hz) FROM " + db_ +
                           ".recordings" + rw + ") FROM " + db_ + ".stack_counts WHERE 1 = 1" + range + rw2);
      if (!windows) return windows.error();
      if (!windows->empty()) {
        uint64_t hz = u64((*windows)[0][3]);
        p.period_ns = hz ? 1'000'000'000ull / hz : 0;
      }
      if (!windows->empty() && u64((*windows)[0][2]) > 0) {
        p.start_ns = u64((*windows)[0][0]);
        p.duration_ns = u64((*windows)[0][1]) - p.start_ns;
      } else {
        p.duration_ns = 0;  // no window in the range: an empty profile
      }
      filter += range;
    }
    // ... and per window rate (WindowFidelity): a window that did not say has its recording's, so the
    // rows are read per (recording, rate) and merged here by the rate they resolve to.
    // Each recording's rate, read only when a row does not carry its window's (rows written before
    // windows said): a read of the whole recordings table per profile otherwise.
    std::optional<std::map<int64_t, unsigned>> rates;
    auto rows = query("SELECT pid, tid, thread_comm, stack_id, sum(value), node, recording_id, " + hz_column() +
                      " AS hz FROM " + db_ + ".stack_counts" + filter +
                      " GROUP BY node, pid, tid, thread_comm, stack_id, recording_id, hz"
                      " ORDER BY node, pid, tid, stack_id, recording_id, hz");
    if (!rows) return rows.error();
    SampleMerger m;
    for (const auto& r : *rows) {
      ProfileSample s;
      s.pid = static_cast<uint32_t>(u64(r[0]));
      s.tid = static_cast<uint32_t>(u64(r[1]));
      s.comm = r[2];
      s.count = u64(r[4]);
      s.node = r[5];
      auto hz = row_hz(u64(r[7]), i64(r[6]), rates);
      if (!hz) return hz.error();
      if (f.kind == CountKind::kOnCpu && *hz > 0) s.period_ns = 1'000'000'000ull / *hz;
      m.add(p, std::move(s), i64(r[3]));
    }
    const std::vector<int64_t>& stack_ids = m.stack_ids;
    p.stacks.resize(stack_ids.size());
    if (stack_ids.empty()) return p;
    // The stacks and frames the samples name, by subquery: a list of ids in the SQL text grows past
    // the server's query size limit (256 KiB: ~13k stacks) on a large job.
    if (auto st = read_stacks("SELECT DISTINCT stack_id FROM " + db_ + ".stack_counts" + filter, stack_ids, p.stacks); !st)
      return st.error();
    return p;
  }

  // How many nodes' profiles one read takes (load_profiles): the node list is in the query's text,
  // which the server caps at 256 KiB; 500 names of up to ~100 bytes stay well under it.
  static constexpr size_t kNodesPerProfileRead = 500;

  // Many nodes' profiles, each over its own span, in one read per kNodesPerProfileRead nodes: a
  // collector's round at 8,000 ranks reads the past of each of 1,000 nodes, and one round trip per
  // node and kind (four before, each a few ms of the server's time) made a round take 20-30 s with
  // ingest waiting behind it. The rows come per window and are summed here per filter, by the same
  // tests the one-profile read makes in its query; what each profile holds is what load_profile
  // gives for its filter alone.
  Result<std::vector<Profile>> load_profiles(const std::vector<ProfileFilter>& fs) override {
    bool together = fs.size() > 1;
    for (const auto& f : fs)
      if (!f.node || f.pid || f.tid || f.rank || f.recording || !f.from_ns || !f.to_ns) together = false;
    if (!together) return Reader::load_profiles(fs);
    std::vector<Profile> out(fs.size());
    for (size_t i = 0; i < fs.size(); ++i) {
      out[i].kind = fs[i].kind == CountKind::kOnCpu ? "oncpu" : "offcpu";
      out[i].value_unit = fs[i].kind == CountKind::kOnCpu ? "count" : "microseconds";
    }
    std::map<std::string, std::vector<size_t>> by_node;
    for (size_t i = 0; i < fs.size(); ++i) by_node[*fs[i].node].push_back(i);
    std::vector<const std::string*> nodes;
    for (const auto& [node, idx] : by_node) nodes.push_back(&node);
    for (size_t first = 0; first < nodes.size(); first += kNodesPerProfileRead) {
      const size_t last = std::min(nodes.size(), first + kNodesPerProfileRead);
      std::string list;
      uint64_t from = UINT64_MAX, to = 0;
      std::map<std::string, std::vector<size_t>> chunk;
      for (size_t k = first; k < last; ++k) {
        list += (list.empty() ? "" : ", ") + quote(*nodes[k]);
        for (size_t i : by_node[*nodes[k]]) from = std::min(from, *fs[i].from_ns), to = std::max(to, *fs[i].to_ns);
        chunk[*nodes[k]] = by_node[*nodes[k]];
      }
      if (auto st = read_node_profiles(fs, chunk, list, from, to, out); !st) return st.error();
    }
    return out;
  }

  Status read_node_profiles(const std::vector<ProfileFilter>& fs, const std::map<std::string, std::vector<size_t>>& by_node,
                            const std::string& node_list, uint64_t from, uint64_t to, std::vector<Profile>& out) {
    const std::string nodes = " IN (" + node_list + ")";
    // Each node's recordings' rate (the profiles' period, as load_profile reads it).
    auto rates = query("SELECT node, max(sample_hz) FROM " + db_ + ".recordings WHERE node" + nodes + " GROUP BY node");
    if (!rates) return rates.error();
    std::map<std::string, uint64_t> node_hz;
    for (const auto& r : *rates) node_hz[r[0]] = u64(r[1]);
    const std::string where = " WHERE node" + nodes + " AND recording_id IN (SELECT id FROM " + db_ +
                              ".recordings WHERE node" + nodes + ") AND end_ns > " + std::to_string(from) +
                              " AND start_ns >= " + std::to_string(from > kMaxRowSpanNs ? from - kMaxRowSpanNs : 0) +
                              " AND start_ns < " + std::to_string(to) + end_buckets("stack_counts", from, to);
    // Both kinds: a profile spans its node's windows of either kind (as load_profile's span does).
    auto rows = query("SELECT node, start_ns, end_ns, kind, pid, tid, thread_comm, stack_id, sum(value), recording_id, " +
                      hz_column() + " AS hz FROM " + db_ + ".stack_counts" + where +
                      " GROUP BY node, start_ns, end_ns, kind, pid, tid, thread_comm, stack_id, recording_id, hz"
                      " ORDER BY node, pid, tid, stack_id, recording_id, hz, start_ns");
    if (!rows) return rows.error();
    std::optional<std::map<int64_t, unsigned>> recording_hz;  // rows written before windows said their rate
    struct Building {
      SampleMerger samples;
      uint64_t start = UINT64_MAX, end = 0;
    };
    std::map<size_t, Building> building;
    std::set<int64_t> all_ids;
    for (const auto& r : *rows) {
      auto n = by_node.find(r[0]);
      if (n == by_node.end()) continue;
      const uint64_t start = u64(r[1]), end = u64(r[2]);
      const auto kind = static_cast<CountKind>(u64(r[3]));
      for (size_t i : n->second) {
        const ProfileFilter& f = fs[i];
        if (!(end > *f.from_ns && start >= (*f.from_ns > kMaxRowSpanNs ? *f.from_ns - kMaxRowSpanNs : 0) && start < *f.to_ns))
          continue;
        Building& b = building[i];
        b.start = std::min(b.start, start);
        b.end = std::max(b.end, end);
        if (kind != f.kind) continue;
        ProfileSample smp;
        smp.pid = static_cast<uint32_t>(u64(r[4]));
        smp.tid = static_cast<uint32_t>(u64(r[5]));
        smp.comm = r[6];
        smp.count = u64(r[8]);
        smp.node = r[0];
        auto hz = row_hz(u64(r[10]), i64(r[9]), recording_hz);
        if (!hz) return hz.error();
        if (f.kind == CountKind::kOnCpu && *hz > 0) smp.period_ns = 1'000'000'000ull / *hz;
        b.samples.add(out[i], std::move(smp), i64(r[7]));
        all_ids.insert(i64(r[7]));
      }
    }
    // The stacks every profile names, read once.
    std::vector<int64_t> ids(all_ids.begin(), all_ids.end());
    std::vector<Stack> stacks;
    if (auto st = read_stacks("SELECT DISTINCT stack_id FROM " + db_ + ".stack_counts" + where, ids, stacks); !st) return st;
    for (const auto& [node, idx] : by_node) {
      for (size_t i : idx) {
        Profile& p = out[i];
        auto hz = node_hz.find(node);
        if (hz != node_hz.end()) p.period_ns = hz->second ? 1'000'000'000ull / hz->second : 0;
        auto b = building.find(i);
        if (b == building.end()) continue;  // no window in the range: an empty profile
        p.start_ns = b->second.start;
        p.duration_ns = b->second.end - b->second.start;
        p.stacks.reserve(b->second.samples.stack_ids.size());
        for (int64_t sid : b->second.samples.stack_ids) {
          auto at = std::lower_bound(ids.begin(), ids.end(), sid);
          p.stacks.push_back(at != ids.end() && *at == sid ? stacks[static_cast<size_t>(at - ids.begin())] : Stack{});
        }
      }
    }
    return {};
  }

  // The stacks of `stack_ids`, in their order (leaf first, inlined functions expanded);
  // `id_query` selects (at least) those ids.
  Status read_stacks(const std::string& id_query, const std::vector<int64_t>& stack_ids, std::vector<Stack>& stacks) {
    stacks.assign(stack_ids.size(), Stack{});
    if (stack_ids.empty()) return {};
    const std::string& sample_stacks = id_query;
    auto st = query("SELECT id, any(frame_ids) FROM " + db_ + ".stacks WHERE id IN (" + sample_stacks + ") GROUP BY id");
    if (!st) return st.error();
    std::map<int64_t, std::vector<int64_t>> frames_of;
    std::set<int64_t> frame_ids;
    for (const auto& r : *st) {
      std::vector<int64_t> ids;
      std::string a = r[1];
      for (char& c : a)
        if (c == '[' || c == ']' || c == ',') c = ' ';
      std::stringstream ss(a);
      int64_t v;
      while (ss >> v) {
        ids.push_back(v);
        frame_ids.insert(v);
      }
      frames_of[i64(r[0])] = std::move(ids);
    }
    std::map<int64_t, Frame> frames;
    if (!frame_ids.empty()) {
      const std::string sample_frames = "SELECT arrayJoin(frame_ids) FROM " + db_ + ".stacks WHERE id IN (" +
                                        sample_stacks + ")";
      auto fr = query("SELECT id, any(kind), any(build_id), any(module), any(offset), any(function), any(file),"
                      " any(line) FROM " + db_ + ".frames WHERE id IN (" + sample_frames + ") GROUP BY id");
      if (!fr) return fr.error();
      for (const auto& r : *fr) {
        Frame x;
        x.kind = static_cast<FrameKind>(u64(r[1]) <= 3 ? u64(r[1]) : 0);
        x.build_id = r[2];
        x.module = r[3];
        x.offset = u64(r[4]);
        x.function = r[5];
        x.file = r[6];
        x.line = static_cast<int>(i64(r[7]));
        frames[i64(r[0])] = std::move(x);
      }
    }
    for (size_t i = 0; i < stack_ids.size(); ++i) {
      for (int64_t fid : frames_of[stack_ids[i]]) {
        auto it = frames.find(fid);
        if (it != frames.end()) stacks[i].push_back(it->second);
      }
      expand_inlined(stacks[i]);
    }
    return {};
  }

  Result<std::vector<ProcessInfo>> processes(std::optional<int64_t> rec) override {
    std::string identity;
    for (const char* c : {"pod_uid", "container_id", "pod_name", "pod_namespace"})
      identity += ", " + column_or_empty("processes", c);
    auto rows = query("SELECT pid, ppid, start_ns, node, comm, command, job, rank, local_rank, world_size" + identity +
                      " FROM " + db_ + ".processes FINAL" + where(rec, std::nullopt) +
                      " ORDER BY recording_id, start_ns, pid");
    if (!rows) return rows.error();
    std::vector<ProcessInfo> out;
    for (const auto& r : *rows) {
      ProcessInfo p;
      p.pid = static_cast<uint32_t>(u64(r[0]));
      p.ppid = static_cast<uint32_t>(u64(r[1]));
      p.start_ns = u64(r[2]);
      p.node = r[3];
      p.comm = r[4];
      p.command = r[5];
      p.job = r[6];
      p.rank = static_cast<int>(i64(r[7]));
      p.local_rank = static_cast<int>(i64(r[8]));
      p.world_size = static_cast<int>(i64(r[9]));
      p.pod_uid = r[10];
      p.container_id = r[11];
      p.pod_name = r[12];
      p.pod_namespace = r[13];
      out.push_back(std::move(p));
    }
    return out;
  }

  Result<std::vector<std::pair<std::string, double>>> stats(int64_t rec) override {
    auto rows = query("SELECT key, value FROM " + db_ + ".agent_stats FINAL WHERE recording_id = " +
                      std::to_string(rec) + " ORDER BY key");
    if (!rows) return rows.error();
    std::vector<std::pair<std::string, double>> out;
    for (const auto& r : *rows) out.emplace_back(r[0], dbl(r[1]));
    return out;
  }

  Result<std::optional<int64_t>> latest_recording() override {
    // Read from the table, not from the recordings this object wrote: a collector's rounds read
    // through store objects of their own, beside the writer. One server numbers recordings in
    // order; ids say nothing of order on a cluster: there, the latest to start.
    // A recording this object began is the latest until it is committed and the table shows it.
    auto r = query("SELECT id FROM " + db_ + ".recordings ORDER BY " + (cluster_.empty() ? "id" : "started_ns") +
                   " DESC LIMIT 1");
    if (!r) return r.error();
    std::optional<int64_t> latest;
    if (!r->empty()) latest = i64((*r)[0][0]);
    if (cluster_.empty() && !recording_nodes_.empty() && (!latest || recording_nodes_.rbegin()->first > *latest))
      latest = recording_nodes_.rbegin()->first;
    return latest;
  }

  Result<std::vector<std::string>> live_collectors(const std::string& self, uint64_t now_ns, uint64_t ttl_ns) override {
    if (auto st = exec("INSERT INTO " + db_ + ".collectors VALUES (" + quote(self) + ", " + std::to_string(now_ns) + ")");
        !st)
      return st.error();
    auto r = query("SELECT id FROM " + db_ + ".collectors FINAL WHERE seen_ns + " + std::to_string(ttl_ns) +
                   " >= " + std::to_string(now_ns) + " ORDER BY id");
    if (!r) return r.error();
    std::vector<std::string> out;
    for (const auto& row : *r) out.push_back(row[0]);
    return out;
  }

  bool shared() const override { return !cluster_.empty(); }

  Status note_jobs(const std::vector<std::string>& jobs, uint64_t now_ns) override {
    if (jobs.empty()) return {};
    std::string values;
    for (const auto& j : jobs) values += (values.empty() ? "(" : ", (") + quote(j) + ", " + std::to_string(now_ns) + ")";
    return exec("INSERT INTO " + db_ + ".job_marks VALUES " + values);
  }

  Result<std::vector<std::pair<std::string, uint64_t>>> noted_jobs(uint64_t since_ns) override {
    auto r = query("SELECT job, max(marked_ns) FROM " + db_ + ".job_marks WHERE marked_ns >= " +
                   std::to_string(since_ns) + " GROUP BY job");
    if (!r) return r.error();
    std::vector<std::pair<std::string, uint64_t>> out;
    for (const auto& row : *r) out.emplace_back(row[0], u64(row[1]));
    return out;
  }

  Result<std::vector<CommunicatorRecord>> communicators(std::optional<int64_t> rec) override {
    RowQuery q;
    q.recording = rec;
    return read_rows(q, "communicators", "init_ns", "init_ns", "init_ns", catalog::kCommunicators);
  }

  Result<std::vector<CollectiveRecord>> collectives(std::optional<int64_t> rec, std::optional<uint32_t> pid) override {
    RowQuery q;
    q.recording = rec;
    q.pid = pid;
    return read_collectives(q, "pid, node, enter_ns");
  }
  Result<std::vector<CollectiveRecord>> query_collectives(const RowQuery& q) override {
    return read_collectives(q, "enter_ns, node, pid");
  }
  Result<std::vector<CollectiveRecord>> read_collectives(const RowQuery& q, const char* order) {
    return read_rows(q, "collectives", "enter_ns", "greatest(exit_ns, enter_ns + 1)", order, catalog::kCollectives);
  }

  Result<std::vector<DeviceActivity>> device_activity(std::optional<int64_t> rec, std::optional<uint32_t> pid) override {
    RowQuery q;
    q.recording = rec;
    q.pid = pid;
    return read_device_activity(q, "pid, node, start_ns");
  }
  Result<std::vector<DeviceActivity>> query_device_activity(const RowQuery& q) override {
    return read_device_activity(q, "start_ns, node, pid");
  }
  Result<std::vector<DeviceActivity>> read_device_activity(const RowQuery& q, const char* order) {
    return read_rows(q, "device_activity", "start_ns", "end_ns", order, catalog::kDeviceActivity);
  }

  Result<std::vector<StepRecord>> steps(std::optional<int64_t> rec, std::optional<uint32_t> pid) override {
    RowQuery q;
    q.recording = rec;
    q.pid = pid;
    return read_steps(q, "pid, node, step");
  }
  Result<std::vector<StepRecord>> query_steps(const RowQuery& q) override { return read_steps(q, "start_ns, node, pid"); }
  Result<std::vector<StepRecord>> read_steps(const RowQuery& q, const char* order) {
    return read_rows(q, "steps", "start_ns", "end_ns", order, catalog::kSteps);
  }

  // A bounded read (select) of a catalog kind's rows; each carries its recording's node.
  template <typename Row, typename Msg, size_t N>
  Result<std::vector<Row>> read_rows(const RowQuery& q, const std::string& table, const std::string& start,
                                     const std::string& end, const char* order,
                                     const catalog::Column<Row, Msg> (&columns)[N]) {
    std::vector<Row> out;
    if (auto st = query_each(select(q, table, start, end, order, select_columns(table, columns)),
                             [&](const std::vector<std::string>& r) {
                               Row x;
                               x.node = r[read_row(r, 0, columns, x)];
                               // Other processes' rows go as they are read (a job's span holds every job's).
                               if (!q.keep_process || q.keep_process(x.node, x.pid)) out.push_back(std::move(x));
                             });
        !st)
      return st.error();
    return out;
  }

  Result<std::optional<uint64_t>> latest_step_ns(std::optional<int64_t> rec) override {
    // count() too: max() of no rows is 0, not NULL.
    auto rows = query("SELECT max(end_ns), count() FROM " + db_ + ".steps" +
                      (rec ? " WHERE recording_id = " + std::to_string(*rec) : std::string()));
    if (!rows) return rows.error();
    if (rows->empty() || u64((*rows)[0][1]) == 0) return std::optional<uint64_t>{};
    return std::optional<uint64_t>{u64((*rows)[0][0])};
  }

  Result<std::vector<ThreadWindow>> thread_windows(const RowQuery& q) override {
    auto rates = recording_rates();
    if (!rates) return rates.error();
    std::string w = " WHERE kind = 0" + std::string(q.recording ? " AND recording_id = " + std::to_string(*q.recording) : "");
    if (q.node) w += " AND node = " + quote(*q.node);
    if (q.pid) w += " AND pid = " + std::to_string(*q.pid);
    if (q.from_ns) {
      w += " AND end_ns > " + std::to_string(*q.from_ns);
      w += " AND start_ns >= " + std::to_string(*q.from_ns > kMaxRowSpanNs ? *q.from_ns - kMaxRowSpanNs : 0);  // partitions
    }
    if (q.to_ns) w += " AND start_ns < " + std::to_string(*q.to_ns);
    w += end_buckets("stack_counts", q.from_ns, q.to_ns);
    auto rows = query("SELECT start_ns, end_ns, pid, tid, thread_comm, sum(value), node, recording_id, " + hz_column() +
                      " AS hz FROM " + db_ + ".stack_counts" + w +
                      " GROUP BY start_ns, end_ns, node, pid, tid, thread_comm, recording_id, hz"
                      " ORDER BY start_ns, node, pid, tid");
    if (!rows) return rows.error();
    std::vector<ThreadWindow> out;
    for (const auto& r : *rows) {
      unsigned hz = static_cast<unsigned>(u64(r[8]));
      out.push_back({u64(r[0]), u64(r[1]), static_cast<uint32_t>(u64(r[2])), static_cast<uint32_t>(u64(r[3])), r[4],
                     u64(r[5]), r[6], hz ? hz : (*rates)[i64(r[7])]});
    }
    return out;
  }

  Result<std::vector<ReducedFidelity>> reduced_fidelity(std::optional<int64_t> rec, std::optional<uint64_t> from_ns,
                                                        std::optional<uint64_t> to_ns) override {
    std::vector<ReducedFidelity> out;
    if (!columns_.count({"stack_counts", "sample_hz"}) || !columns_.count({"stack_counts", "unwinding"})) return out;
    auto rates = recording_rates();
    if (!rates) return rates.error();
    // Each row carries its window: one per (recording, window) of on-CPU counts, of those below the
    // highest configured rate or unwound with frame pointers only (reduced_runs keeps the reduced).
    unsigned top_hz = 0;
    for (const auto& [id, hz] : *rates) top_hz = std::max(top_hz, hz);
    std::string w = " WHERE kind = 0 AND sample_hz > 0 AND (sample_hz < " + std::to_string(top_hz) +
                    " OR unwinding = " + quote(kUnwindingFramePointers) + ")" +
                    std::string(rec ? " AND recording_id = " + std::to_string(*rec) : "") +
                    std::string(from_ns ? " AND end_ns > " + std::to_string(*from_ns) : "") +
                    std::string(to_ns ? " AND start_ns < " + std::to_string(*to_ns) : "");
    auto rows = query("SELECT recording_id, any(node), start_ns, end_ns, any(sample_hz), any(unwinding) FROM " + db_ +
                      ".stack_counts" + w + " GROUP BY recording_id, start_ns, end_ns ORDER BY recording_id, start_ns");
    if (!rows) return rows.error();
    std::vector<FidelityWindow> windows;
    windows.reserve(rows->size());
    for (const auto& r : *rows)
      windows.push_back({i64(r[0]), r[1], u64(r[2]), u64(r[3]), (*rates)[i64(r[0])], static_cast<unsigned>(u64(r[4])),
                         r[5]});
    return reduced_runs(windows);
  }

  // Each recording's configured rate, by id.
  Result<std::map<int64_t, unsigned>> recording_rates() {
    auto rows = query("SELECT id, max(sample_hz) FROM " + db_ + ".recordings GROUP BY id");
    if (!rows) return rows.error();
    std::map<int64_t, unsigned> out;
    for (const auto& r : *rows) out[i64(r[0])] = static_cast<unsigned>(u64(r[1]));
    return out;
  }
  // The windows' rate column of stack_counts, or 0 (not said) where this database lacks it.
  std::string hz_column() const { return columns_.count({"stack_counts", "sample_hz"}) ? "sample_hz" : "toUInt32(0)"; }

  Result<unsigned> sample_hz(std::optional<int64_t> rec) override {
    auto rows = query("SELECT max(sample_hz) FROM " + db_ + ".recordings" +
                      (rec ? " WHERE id = " + std::to_string(*rec) : std::string()));
    if (!rows) return rows.error();
    return rows->empty() ? 0u : static_cast<unsigned>(u64((*rows)[0][0]));
  }

  Result<std::vector<MetricRow>> metrics(const std::string& prefix, std::optional<int64_t> rec) override {
    RowQuery q;
    q.prefix = prefix;
    q.recording = rec;
    return read_metrics(q, "start_ns, pid, name, label");
  }
  Result<std::vector<MetricRow>> query_metrics(const RowQuery& q) override {
    return read_metrics(q, "start_ns, node, pid, name, label");
  }
  Result<std::vector<MetricRow>> read_metrics(const RowQuery& q, const char* order) {
    std::vector<MetricRow> out;
    if (auto st = query_each(select(q, "metrics", "start_ns", "end_ns", order,
                                    "start_ns, end_ns, " + select_columns("metrics", catalog::kMetrics),
                                    " AND substring(name, 1, " + std::to_string(q.prefix.size()) + ") = " + quote(q.prefix)),
                             [&](const Row& r) {
                               MetricRow m;
                               m.start_ns = u64(r[0]);
                               m.end_ns = u64(r[1]);
                               m.node = r[read_row(r, 2, catalog::kMetrics, m.metric)];
                               if (!q.keep_process || q.keep_process(m.node, m.metric.pid)) out.push_back(std::move(m));
                             });
        !st)
      return st.error();
    return out;
  }

  Result<LaunchSamples> query_launch_samples(const RowQuery& q) override {
    const std::string by_prefix = " AND substring(kernel, 1, " + std::to_string(q.prefix.size()) + ") = " + quote(q.prefix);
    auto rows = query(select(q, "launch_samples", "start_ns", "end_ns", "start_ns, node, pid, tid, kernel, stack_id",
                             "start_ns, end_ns, " + select_columns("launch_samples", catalog::kLaunchSamples), by_prefix));
    if (!rows) return rows.error();
    LaunchSamples out;
    std::map<int64_t, uint32_t> index;
    std::vector<int64_t> stack_ids;
    for (const auto& r : *rows) {
      LaunchSampleRow x;
      x.start_ns = u64(r[0]);
      x.end_ns = u64(r[1]);
      x.node = r[read_row(r, 2, catalog::kLaunchSamples, x.sample)];
      auto [it, inserted] = index.emplace(x.sample.stack_id, static_cast<uint32_t>(stack_ids.size()));
      if (inserted) stack_ids.push_back(x.sample.stack_id);
      x.stack_index = it->second;
      out.rows.push_back(std::move(x));
    }
    // The rows' stacks by the same filter, unpaged (a page's stacks are among them): a list of ids
    // in the SQL text could pass the server's query size limit.
    RowQuery all = q;
    all.limit = all.offset = 0;
    std::string ids = select(all, "launch_samples", "start_ns", "end_ns", "stack_id", "stack_id", by_prefix);
    ids = "SELECT stack_id FROM (" + ids + ")";
    if (auto st = read_stacks(ids, stack_ids, out.stacks); !st) return st.error();
    return out;
  }

 private:
  // One bounded read (RowQuery) of a table: every row carries its node, the last column here.
  std::string select(const RowQuery& q, const std::string& table, const std::string& start, const std::string& end,
                     const std::string& order, const std::string& columns, const std::string& extra = "") const {
    std::string w = " WHERE 1" + extra;
    if (q.recording) w += " AND recording_id = " + std::to_string(*q.recording);
    if (q.node) w += " AND node = " + quote(*q.node);
    if (q.pid) w += " AND pid = " + std::to_string(*q.pid);
    if (q.from_ns) {
      w += " AND " + end + " > " + std::to_string(*q.from_ns);
      // On the partition key's column: ClickHouse skips the days before the span.
      w += " AND " + start + " >= " + std::to_string(*q.from_ns > kMaxRowSpanNs ? *q.from_ns - kMaxRowSpanNs : 0);
    }
    if (q.to_ns) w += " AND " + start + " < " + std::to_string(*q.to_ns);
    w += end_buckets(table, q.from_ns, q.to_ns);
    std::string sql = "SELECT " + columns + ", node FROM " + db_ + "." + table + w;
    // A reader that sums the rows (RowQuery::any_order) spares the server the sort; pages need one.
    if (!q.any_order || q.limit || q.offset) sql += " ORDER BY " + order;
    if (q.limit) sql += " LIMIT " + (q.offset ? std::to_string(q.offset) + ", " : std::string()) + std::to_string(q.limit);
    else if (q.offset) sql += " LIMIT " + std::to_string(q.offset) + ", 18446744073709551615";
    return sql;
  }

  static std::string where(std::optional<int64_t> rec, std::optional<uint32_t> pid) {
    std::string w = " WHERE 1";
    if (rec) w += " AND recording_id = " + std::to_string(*rec);
    if (pid) w += " AND pid = " + std::to_string(*pid);
    return w;
  }

  // Row versions for ReplacingMergeTree: the newest write of a key wins.
  uint64_t version() { return ++version_ + static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()); }

  void buffer_recording(int64_t id, uint64_t ended_ns) {
    const auto& r = recordings_[id];
    buf("recordings").num(id).str(r.node).str(r.command).num(r.started_ns).num(ended_ns).num(static_cast<uint32_t>(r.sample_hz))
        .num(r.window_s).num(version());
    tag(buf("recordings"));
  }

  RowBinary& tag(RowBinary& b) { return b.str(batch_agent_).num(batch_id_); }

  const std::string& node_of(int64_t rec) {
    static const std::string unknown;
    auto it = recording_nodes_.find(rec);
    if (it != recording_nodes_.end()) return it->second;
    // Begun by another collector of the cluster (or before this one started): read it once.
    auto r = query("SELECT node FROM " + db_ + ".recordings WHERE id = " + std::to_string(rec) + " LIMIT 1");
    if (!r || r->empty()) return unknown;
    return recording_nodes_[rec] = (*r)[0][0];
  }

  static int64_t random_id() {
    static std::mt19937_64 gen{std::random_device{}()};
    static std::mutex mu;
    std::lock_guard lock(mu);
    return static_cast<int64_t>(gen() >> 2) + 1;
  }

  RowBinary& buf(const std::string& table) { return buffers_[table]; }

  // A database read only from before schema 3 has no diagnosis tables: it kept nothing.
  static bool missing_table(const Error& e) { return e.message.find("doesn't exist") != std::string::npos; }

  Error err(const std::string& what, const httplib::Result& res) const {
    std::string why = res ? "HTTP " + std::to_string(res->status) + ": " + res->body.substr(0, 300)
                          : "unreachable (" + httplib::to_string(res.error()) + ")";
    while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
    for (char& c : why)
      if (c == '\n') c = ' ';
    return Error{"clickhouse " + host_ + ":" + std::to_string(port_) + ": " + what + ": " + why};
  }

  // On a cluster, every request carries these settings: an insert returns once every shard has its
  // rows (a batch is acknowledged, and marked applied, only when it is in), and a subquery over a
  // Distributed table inside a query over another (IN (SELECT ...)) is run once and its result
  // sent to the shards (GLOBAL IN), which 18.16 otherwise refuses.
  static constexpr const char* kClusterSettings = "insert_distributed_sync=1&distributed_product_mode=global";
  std::string settings_path() const { return cluster_.empty() ? "/" : "/?" + std::string(kClusterSettings); }

  Status exec(const std::string& sql) {
    auto res = cli_.Post(settings_path(), sql, "text/plain");
    if (!res || res->status != 200) return err(sql.substr(0, 60), res);
    return {};
  }

  Status insert(const std::string& table, const std::string& rows) {
    // The catalog's kinds name their columns (insert_columns).
    static const std::map<std::string, std::string> named = {
        {"steps", " (" + insert_columns(catalog::kSteps) + ")"},
        // (a table with a computed column, end_10s, names the columns its rows give)
        {"stack_counts", " (recording_id, node, start_ns, end_ns, kind, pid, tid, thread_comm, stack_id, value, ingest_agent,"
                         " ingest_batch, sample_hz, unwinding)"},
        {"metrics", " (" + insert_columns(catalog::kMetrics, /*of_window=*/true) + ")"},
        {"launch_samples", " (" + insert_columns(catalog::kLaunchSamples, /*of_window=*/true) + ")"},
        {"communicators", " (" + insert_columns(catalog::kCommunicators) + ")"},
        {"collectives", " (" + insert_columns(catalog::kCollectives) + ")"},
        {"device_activity", " (" + insert_columns(catalog::kDeviceActivity) + ")"},
    };
    auto cols = named.find(table);
    std::string path = "/?query=" + httplib::detail::encode_query_param("INSERT INTO " + db_ + "." + table +
                                                                        (cols == named.end() ? "" : cols->second) +
                                                                        " FORMAT RowBinary");
    if (!cluster_.empty()) path += "&" + std::string(kClusterSettings);
    auto res = cli_.Post(path, rows, "application/octet-stream");
    if (!res || res->status != 200) return err("inserting into " + table, res);
    return {};
  }

  Result<std::vector<Row>> query(const std::string& sql) { return query_at(cli_, sql); }

  Result<std::vector<Row>> query_at(httplib::Client& server, const std::string& sql) {
    std::vector<Row> out;
    if (auto st = query_each_at(server, sql, [&](const Row& r) { out.push_back(r); }); !st) return st.error();
    return out;
  }

  // Each row of an answer, parsed a line at a time into one reused Row and handed to `fn`: a round
  // at 8,000 ranks reads millions of rows, and every row's fields held as strings at once (~50 bytes
  // a field, 12 fields a row) beside the typed rows made most of the collector's peak memory.
  Status query_each(const std::string& sql, const std::function<void(const Row&)>& fn) {
    return query_each_at(cli_, sql, fn);
  }
  Status query_each_at(httplib::Client& server, const std::string& sql, const std::function<void(const Row&)>& fn) {
    auto res = server.Post(settings_path(), sql + " FORMAT TabSeparated", "text/plain");
    if (!res || res->status != 200) return err(sql.substr(0, 60), res);
    const std::string_view body = res->body;
    Row r;
    size_t pos = 0;
    while (pos < body.size()) {
      size_t nl = body.find('\n', pos);
      if (nl == std::string_view::npos) nl = body.size();
      const std::string_view line = body.substr(pos, nl - pos);
      pos = nl + 1;
      size_t fields = 0, start = 0;
      while (true) {
        const size_t tab = line.find('\t', start);
        if (fields == r.size()) r.emplace_back();
        unescape_into(line.substr(start, tab == std::string_view::npos ? std::string_view::npos : tab - start), r[fields++]);
        if (tab == std::string_view::npos) break;
        start = tab + 1;
      }
      r.resize(fields);
      fn(r);
    }
    return {};
  }

  std::string host_;
  int port_;
  std::string db_;
  std::string cluster_;  // the ClickHouse cluster the tables are sharded over; empty: one server
  httplib::Client cli_;
  std::vector<std::unique_ptr<httplib::Client>> shards_;  // on a cluster: each shard's server
  std::vector<std::string> shard_hosts_;
  std::map<std::string, RowBinary> buffers_;
  std::map<int64_t, std::string> recording_nodes_;
  std::map<int64_t, RecordingInfo> recordings_;
  int64_t next_recording_ = 1;
  uint64_t version_ = 0;
  std::unordered_set<int64_t> known_frames_, known_stacks_;
  std::set<std::pair<std::string, uint64_t>> applied_;
  std::set<std::pair<std::string, std::string>> columns_;  // (table, column) this database has
  std::string batch_agent_;  // the ingest batch being written (begin_batch), tagged on its rows
  uint64_t batch_id_ = 0;
  long failpoint_inserts_ = 0;
  std::vector<std::pair<std::string, uint64_t>> applied_pending_;
  // The batches of the transaction under way whose marks were read together (prepare_batches), and
  // those of them with an attempt on record; both forgotten at commit and rollback.
  std::set<std::pair<std::string, uint64_t>> prepared_, attempted_;
};

}  // namespace

Result<std::unique_ptr<Store>> Store::open_clickhouse(const std::string& url, Mode mode) {
  // clickhouse://HOST:PORT/DB[?retention_days=N][&cluster=NAME]
  const std::string scheme = "clickhouse://";
  std::string rest = url.substr(scheme.size());
  unsigned retention_days = 0;
  std::string cluster;
  if (auto q = rest.find('?'); q != std::string::npos) {
    std::string params = rest.substr(q + 1);
    rest = rest.substr(0, q);
    std::stringstream ss(params);
    std::string kv;
    while (std::getline(ss, kv, '&')) {
      auto eq = kv.find('=');
      std::string key = kv.substr(0, eq), value = eq == std::string::npos ? "" : kv.substr(eq + 1);
      if (key == "retention_days" && !value.empty() && value.find_first_not_of("0123456789") == std::string::npos &&
          value.size() <= 6) {
        retention_days = static_cast<unsigned>(std::stoul(value));
      } else if (key == "cluster" && !value.empty() &&
                 value.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") ==
                     std::string::npos) {
        cluster = value;
      } else {
        return Error{"--store " + url + ": unknown or bad parameter '" + kv +
                     "' (known: retention_days=DAYS, cluster=NAME of letters, digits, _)"};
      }
    }
  }
  auto slash = rest.find('/');
  std::string hostport = rest.substr(0, slash);
  std::string db = slash == std::string::npos ? "strata" : rest.substr(slash + 1);
  auto colon = hostport.rfind(':');
  std::string host = hostport.substr(0, colon);
  int port = colon == std::string::npos ? 8123 : std::atoi(hostport.c_str() + colon + 1);
  if (host.empty() || port <= 0 || port > 65535 || db.empty() ||
      db.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") != std::string::npos)
    return Error{"--store " + url + ": expected clickhouse://HOST:PORT/DB (DB: letters, digits, _)"};
  auto s = std::make_unique<ClickHouseStore>(host, port, db, cluster);
  if (auto st = s->open(mode); !st) return st.error();
  if (retention_days > 0 && mode != Mode::kReadOnly) {
    if (auto st = s->apply_retention(retention_days); !st) return st.error();
  }
  return std::unique_ptr<Store>(std::move(s));
}

}  // namespace strata::store
