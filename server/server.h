// `strata serve`: the collector. Ingest (POST /api/v1/ingest), the REST query API under /api/v1/,
// its own /metrics, and the web UI's static files at /. One store, written by one thread at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"
#include "store/store.h"

namespace strata::server {

struct ServeOptions {
  std::string store = "sqlite:strata-server.db";  // sqlite:FILE.db | clickhouse://HOST:PORT/DB
  std::string listen = "127.0.0.1:7878";
  std::string token;    // empty: no authentication
  std::string web_dir;  // static files for /; a placeholder page when empty or missing
  size_t max_compressed = 32u << 20;
  size_t max_decompressed = 256u << 20;
  double silent_after_s = 0;  // 0: three of the agent's own send intervals (at least 5 s)
  double diagnose_every_s = 2;  // a diagnosis round for jobs with new data; 0: only when asked
  double diagnose_join_grace_s = 30;  // a job's rounds wait this long at most for its ranks to join (kJoinGraceNs)
  // Hard limits (README "Limits"); the defaults are explained where they are used.
  uint64_t max_batch_rows = 1'000'000;  // rows in one ingest batch (ingest::DecodeLimits::max_rows)
  size_t max_connections = 512;         // open HTTP connections (server/guarded_server.h)
  double request_deadline_s = 60;       // for a request to arrive whole
  // Drill-down (server/drilldown.h): hosts besides an agent's own address that its drilldown_url
  // may name (an agent behind NAT announcing its node's address).
  std::vector<std::string> drilldown_allow;
  size_t max_drilldown_bytes = 64u << 20;  // an agent's answer, at most
  std::vector<std::string> startup_notes;  // logged ("strata: NOTE") once listening
};

// Whether a --store names a store strata speaks: sqlite:FILE.db, a bare FILE.db, or
// clickhouse://HOST:PORT/DB; "mysql:foo" is refused, not taken for a file name.
Status check_store_spec(const std::string& spec);

// sqlite:FILE.db[?retention_days=N][&wal_max_mb=M] (or a bare FILE.db): the file, the days its
// rows are kept (0: for ever), and the size past which the collector truncates the write-ahead log
// FILE.db-wal. A bad value is refused with the reason (exit code 2).
struct SqliteSpec {
  std::string path;
  unsigned retention_days = 0;
  unsigned wal_max_mb = 0;  // 0: kDefaultWalMaxMb
};
// At most a century: a larger number is a typo, not a policy.
inline constexpr unsigned long kMaxRetentionDays = 36500;
// The write-ahead log's size past which the collector makes a gap in its rounds' reads and
// truncates it (Store::truncate_log). SQLite's own checkpoints keep it near 4 MB while nobody
// reads; the rounds' overlapping reads stop that (measured: 18.5 GB in 7 minutes of a 1,000-node
// ingest). 256 MB: a minute or more of a large cluster's ingest between truncations (one takes
// about a second per 100 MB), at a disk cost nobody notices.
inline constexpr unsigned kDefaultWalMaxMb = 256;
inline constexpr unsigned long kMaxWalMaxMb = 1u << 20;  // a TB: a larger number is a typo
// The collector's writing connection to an SQLite store (store::SqliteTuning). Measured with
// bench/ingest_scale.sh (1,000 nodes x 8 ranks, with group commit) against SQLite's 2 MB cache and
// 1,000-page checkpoints: 64 MB of cache cut the bytes read per ingested row ~4x (the indexes' pages that
// every node's batch touches stay cached), and checkpoints every 16,384 pages (64 MB of log, a
// quarter of kDefaultWalMaxMb) copy a page that many commits rewrote into the database once, not
// once per 1,000 pages. Memory: 64 MB at most, inside the collector's 2 GB budget.
inline constexpr int kCollectorCacheKib = 64 * 1024;
inline constexpr int kCollectorAutocheckpointPages = 16384;
// How often the collector looks at the log's size.
inline constexpr int kWalCheckEveryS = 5;
// How often the collector deletes what is past retention, and at most how many rows of each table
// one batch deletes while it holds the store (tens of milliseconds: ingest waits that long at most).
inline constexpr int kRetentionEveryS = 600;
inline constexpr uint64_t kRetentionBatchRows = 10000;
Result<SqliteSpec> parse_sqlite_spec(const std::string& spec);

// Opens the store an option names (sqlite:FILE.db, a bare FILE.db, or clickhouse://HOST:PORT/DB).
Result<std::unique_ptr<store::Store>> open_store(const std::string& spec, store::Store::Mode mode);

// Runs until `stop` becomes true (checked a few times a second). Errors: bad address, port taken,
// store that cannot be opened.
Status serve(const ServeOptions& opts, const std::atomic<bool>& stop, std::ostream& log);

}  // namespace strata::server
