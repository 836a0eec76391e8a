// One catalog of record kinds (issue 16 item 8). A kind's columns are described once, here: a
// name, the field of the store's row struct (store.h) and of the ingest message (proto/ingest.proto,
// the same name unless STRATA_COLUMN_AS says another), in table order. The rest is derived from that
// description: both stores' table columns, inserts and reads, the columns an older store lacks (added
// when it is opened for writing, read as their default when it is opened read only), the agent's
// encoding of the kind into a batch, the collector's decoding, and the query API's JSON (steps,
// collectives, metrics, launch samples) and the remote reader's (metrics, launch samples).
//
// Adding a field to a kind described here: the struct in store.h, the message in proto/ingest.proto
// (an older agent's rows then read it as 0 / ""), and the kind's table below, at its end (a table
// made before gets the column appended; inserts and reads name their columns, so its place in an
// older table does not matter). store_test's Catalog tests then check it each way a row travels.
// Not derived: a table's indexes and ClickHouse ORDER BY / PARTITION BY (the stores' DDL around
// the columns), and what reads filter on (RowQuery).
//
// Kinds described: communicators, collectives, device activity, steps, metrics, launch samples.
// Still written by hand in each place: processes (an `id` key and a version column in the middle of
// its tables, its identity columns checked apart), recordings, stacks and frames (nested: a stack is
// a list of frames, interned by content), stack counts (windows with a fidelity, and stack ids
// mapped), stats, and the collector's own tables (ledger, diagnoses).
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <variant>

#include "common/json.h"
#include "ingest.pb.h"
#include "store/store.h"

namespace strata::store::catalog {

// A column: `member` says its type and where a row keeps it; the two functions copy it between the
// row and its ingest message (generated accessors cannot be named generically, so the macro below
// writes them from the one name).
template <typename Row, typename Msg>
struct Column {
  using Member = std::variant<uint32_t Row::*, uint64_t Row::*, int Row::*, int64_t Row::*, bool Row::*,
                              double Row::*, std::string Row::*>;
  const char* name;
  Member member;
  void (*to_message)(const Row&, Msg&);
  void (*from_message)(const Msg&, Row&);
};

#define STRATA_COLUMN(Row, Msg, field)                                         \
  ::strata::store::catalog::Column<Row, Msg> {                                 \
    #field, &Row::field, [](const Row& r, Msg& m) { m.set_##field(r.field); }, \
        [](const Msg& m, Row& r) { r.field = m.field(); }                      \
  }

// The same for a column whose ingest field has another name (a launch sample's `stack_id` travels
// as `stack`, the agent-local StackDef id that the collector maps to its own).
#define STRATA_COLUMN_AS(Row, Msg, field, msg_field)                                     \
  ::strata::store::catalog::Column<Row, Msg> {                                           \
    #field, &Row::field, [](const Row& r, Msg& m) { m.set_##msg_field(r.field); },       \
        [](const Msg& m, Row& r) { r.field = m.msg_field(); }                            \
  }

// A column's C++ type, by visiting its member: the stores map it to theirs.
template <typename Row, typename T>
using MemberType = std::remove_cvref_t<decltype(std::declval<Row&>().*std::declval<T>())>;

// SQLite's declared type (its affinity) and ClickHouse's type of a column.
template <typename Row, typename Msg>
const char* sqlite_type(const Column<Row, Msg>& c) {
  return std::visit(
      [](auto m) -> const char* {
        using T = MemberType<Row, decltype(m)>;
        if constexpr (std::is_same_v<T, std::string>) return "TEXT";
        else if constexpr (std::is_same_v<T, double>) return "REAL";
        else return "INTEGER";
      },
      c.member);
}

template <typename Row, typename Msg>
const char* clickhouse_type(const Column<Row, Msg>& c) {
  return std::visit(
      [](auto m) -> const char* {
        using T = MemberType<Row, decltype(m)>;
        if constexpr (std::is_same_v<T, std::string>) return "String";
        else if constexpr (std::is_same_v<T, double>) return "Float64";
        else if constexpr (std::is_same_v<T, bool>) return "UInt8";
        else if constexpr (std::is_same_v<T, int>) return "Int32";
        else if constexpr (std::is_same_v<T, uint32_t>) return "UInt32";
        else if constexpr (std::is_same_v<T, int64_t>) return "Int64";
        else return "UInt64";
      },
      c.member);
}

// The ingest message of a row, and the row of a message.
template <typename Row, typename Msg, size_t N>
void to_message(const Column<Row, Msg> (&columns)[N], const Row& r, Msg& m) {
  for (const auto& c : columns) c.to_message(r, m);
}
template <typename Row, typename Msg, size_t N>
Row from_message(const Column<Row, Msg> (&columns)[N], const Msg& m) {
  Row r;
  for (const auto& c : columns) c.from_message(m, r);
  return r;
}

// A row's columns as JSON members, `,"name":value` each (the query API's rows).
template <typename Row, typename Msg, size_t N>
std::string json_members(const Column<Row, Msg> (&columns)[N], const Row& r) {
  std::string o;
  for (const auto& c : columns) {
    o += ",\"" + std::string(c.name) + "\":";
    std::visit(
        [&](auto m) {
          using T = MemberType<Row, decltype(m)>;
          if constexpr (std::is_same_v<T, std::string>) o += json_str(r.*m);
          else if constexpr (std::is_same_v<T, bool>) o += r.*m ? "true" : "false";
          else o += json_num(r.*m);
        },
        c.member);
  }
  return o;
}

// -- the kinds

// One training iteration of one process (StepRecord; ingest Step). Rows read back also carry the
// recording's node, which is not a column of the kind: a row's node is its recording's.
inline constexpr Column<StepRecord, ingest::Step> kSteps[] = {
    STRATA_COLUMN(StepRecord, ingest::Step, pid),
    STRATA_COLUMN(StepRecord, ingest::Step, step),
    STRATA_COLUMN(StepRecord, ingest::Step, start_ns),
    STRATA_COLUMN(StepRecord, ingest::Step, end_ns),
    STRATA_COLUMN(StepRecord, ingest::Step, collective_ns),
    STRATA_COLUMN(StepRecord, ingest::Step, device_collective_ns),
    STRATA_COLUMN(StepRecord, ingest::Step, device_compute_ns),
    STRATA_COLUMN(StepRecord, ingest::Step, gpu_idle_ns),
    STRATA_COLUMN(StepRecord, ingest::Step, device_known),
};

// One collective or p2p call (CollectiveRecord; ingest Collective). Rows read back carry their
// recording's node.
inline constexpr Column<CollectiveRecord, ingest::Collective> kCollectives[] = {
    STRATA_COLUMN(CollectiveRecord, ingest::Collective, pid),
    STRATA_COLUMN(CollectiveRecord, ingest::Collective, tid),
    STRATA_COLUMN(CollectiveRecord, ingest::Collective, library),
    STRATA_COLUMN(CollectiveRecord, ingest::Collective, op),
    STRATA_COLUMN(CollectiveRecord, ingest::Collective, comm_id),
    STRATA_COLUMN(CollectiveRecord, ingest::Collective, comm_handle),
    STRATA_COLUMN(CollectiveRecord, ingest::Collective, seq),
    STRATA_COLUMN(CollectiveRecord, ingest::Collective, count),
    STRATA_COLUMN(CollectiveRecord, ingest::Collective, dtype),
    STRATA_COLUMN(CollectiveRecord, ingest::Collective, bytes),
    STRATA_COLUMN(CollectiveRecord, ingest::Collective, redop),
    STRATA_COLUMN(CollectiveRecord, ingest::Collective, peer),
    STRATA_COLUMN(CollectiveRecord, ingest::Collective, stream),
    STRATA_COLUMN(CollectiveRecord, ingest::Collective, enter_ns),
    STRATA_COLUMN(CollectiveRecord, ingest::Collective, exit_ns),
    STRATA_COLUMN(CollectiveRecord, ingest::Collective, device_start_ns),
    STRATA_COLUMN(CollectiveRecord, ingest::Collective, device_end_ns),
    STRATA_COLUMN(CollectiveRecord, ingest::Collective, completion),
    STRATA_COLUMN(CollectiveRecord, ingest::Collective, ret),
};

// Work on a GPU, or a sampled launch's host call (DeviceActivity; ingest DeviceActivity). Rows read
// back carry their recording's node.
inline constexpr Column<DeviceActivity, ingest::DeviceActivity> kDeviceActivity[] = {
    STRATA_COLUMN(DeviceActivity, ingest::DeviceActivity, pid),
    STRATA_COLUMN(DeviceActivity, ingest::DeviceActivity, device),
    STRATA_COLUMN(DeviceActivity, ingest::DeviceActivity, kind),
    STRATA_COLUMN(DeviceActivity, ingest::DeviceActivity, name),
    STRATA_COLUMN(DeviceActivity, ingest::DeviceActivity, stream),
    STRATA_COLUMN(DeviceActivity, ingest::DeviceActivity, start_ns),
    STRATA_COLUMN(DeviceActivity, ingest::DeviceActivity, end_ns),
    STRATA_COLUMN(DeviceActivity, ingest::DeviceActivity, api_ns),
    STRATA_COLUMN(DeviceActivity, ingest::DeviceActivity, api_tid),
    STRATA_COLUMN(DeviceActivity, ingest::DeviceActivity, correlation),
    STRATA_COLUMN(DeviceActivity, ingest::DeviceActivity, bytes),
};

// A communicator a process created (CommunicatorRecord; ingest Communicator). Rows read back carry
// their recording's node.
inline constexpr Column<CommunicatorRecord, ingest::Communicator> kCommunicators[] = {
    STRATA_COLUMN(CommunicatorRecord, ingest::Communicator, pid),
    STRATA_COLUMN(CommunicatorRecord, ingest::Communicator, handle),
    STRATA_COLUMN(CommunicatorRecord, ingest::Communicator, comm_id),
    STRATA_COLUMN(CommunicatorRecord, ingest::Communicator, rank),
    STRATA_COLUMN(CommunicatorRecord, ingest::Communicator, nranks),
    STRATA_COLUMN(CommunicatorRecord, ingest::Communicator, init_ns),
};

// A per-window measurement (Metric; ingest Metric). Counted per window: a row's table also has
// the window's start_ns and end_ns (ingest: its Metrics message's), and rows read back carry them
// and their recording's node (Reader::MetricRow).
inline constexpr Column<Metric, ingest::Metric> kMetrics[] = {
    STRATA_COLUMN(Metric, ingest::Metric, pid),
    STRATA_COLUMN(Metric, ingest::Metric, name),
    STRATA_COLUMN(Metric, ingest::Metric, label),
    STRATA_COLUMN(Metric, ingest::Metric, value),
};

// A sampled kernel launch or memory call (LaunchSample; ingest LaunchSample), counted per window as
// metrics are. `stack_id` is the store's stack; its ingest field `stack` is the agent's StackDef id,
// which the collector maps to the store's after decoding.
inline constexpr Column<LaunchSample, ingest::LaunchSample> kLaunchSamples[] = {
    STRATA_COLUMN(LaunchSample, ingest::LaunchSample, pid),
    STRATA_COLUMN(LaunchSample, ingest::LaunchSample, tid),
    STRATA_COLUMN(LaunchSample, ingest::LaunchSample, kernel),
    STRATA_COLUMN_AS(LaunchSample, ingest::LaunchSample, stack_id, stack),
    STRATA_COLUMN(LaunchSample, ingest::LaunchSample, count),
};

// Every kind above and its table: stores walk them to give an older store the columns it lacks.
template <typename F>
void for_each_kind(F&& f) {
  f("communicators", kCommunicators);
  f("collectives", kCollectives);
  f("device_activity", kDeviceActivity);
  f("steps", kSteps);
  f("metrics", kMetrics);
  f("launch_samples", kLaunchSamples);
}

// What an older store without a column reads in its place (the row struct's default for the
// columns added so far: 0, "").
template <typename Row, typename Msg>
const char* default_literal(const Column<Row, Msg>& c) {
  return std::visit(
      [](auto m) -> const char* {
        using T = MemberType<Row, decltype(m)>;
        if constexpr (std::is_same_v<T, std::string>) return "''";
        else return "0";
      },
      c.member);
}

}  // namespace strata::store::catalog
