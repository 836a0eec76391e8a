// The SQLite store: round trips, interning, filters, and refusing what is not a strata store (the
// time range also on ClickHouse, when a server is given).
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cstdlib>

#include "store/store.h"
#include "tests/support/run.h"

namespace strata::store {
namespace {

using test::TempDir;

Frame native(const std::string& fn, uint64_t off) {
  Frame f;
  f.kind = FrameKind::kNative;
  f.build_id = "abcd";
  f.module = "/usr/bin/app";
  f.offset = off;
  f.function = fn;
  return f;
}

// A time range keeps the windows that overlap [from, to) and says which span they cover (the web
// UI's flame graph of a rank in a window of the heatmap). The same checks run on every backend.
void check_time_range(Store& s) {
  ASSERT_TRUE(s.begin());
  auto rec = s.begin_recording({"node-1", "app", 1000, 99, 10});
  ASSERT_TRUE(rec) << rec.error().message;
  ProcessInfo p;
  p.pid = 42;
  p.node = "node-1";
  p.rank = 3;
  ASSERT_TRUE(s.put_process(*rec, p));
  auto a = s.intern_stack({native("leaf", 0x10), native("main", 0x20)});
  auto b = s.intern_stack({native("other", 0x30), native("main", 0x20)});
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(s.put_window(*rec, 1000, 2000, CountKind::kOnCpu, {{42, 42, "app", *a, 5}, {42, 43, "w", *b, 7}}));
  ASSERT_TRUE(s.put_window(*rec, 2000, 3000, CountKind::kOnCpu, {{42, 42, "app", *a, 3}}));
  ASSERT_TRUE(s.put_window(*rec, 3000, 4000, CountKind::kOffCpu, {{42, 42, "app", *b, 900}}));
  ASSERT_TRUE(s.end_recording(*rec, 4000));
  auto committed = s.commit();
  ASSERT_TRUE(committed) << committed.error().message;

  auto load = [&](std::optional<uint64_t> from, std::optional<uint64_t> to, CountKind kind = CountKind::kOnCpu) {
    ProfileFilter f;
    f.from_ns = from;
    f.to_ns = to;
    f.kind = kind;
    f.rank = 3;
    auto prof = s.load_profile(f);
    EXPECT_TRUE(prof) << prof.error().message;
    return prof ? *prof : report::Profile{};
  };
  EXPECT_EQ(load({}, {}).total(), 15u) << "no range: the whole recording";
  auto first = load(0, 1500);
  EXPECT_EQ(first.total(), 12u);
  EXPECT_EQ(first.start_ns, 1000u) << "the span of the windows kept, not the range asked";
  EXPECT_EQ(first.duration_ns, 1000u);
  EXPECT_EQ(load(2000, {}).total(), 3u) << "windows are half-open: [1000, 2000) ends where 2000 starts";
  EXPECT_EQ(load({}, 2000).total(), 12u);
  auto both = load(1500, 2500);
  EXPECT_EQ(both.total(), 15u) << "a range across two windows keeps both";
  EXPECT_EQ(both.start_ns, 1000u);
  EXPECT_EQ(both.duration_ns, 2000u);
  EXPECT_EQ(load(1999, 2001).total(), 15u);
  auto none = load(5000, 6000);
  EXPECT_EQ(none.total(), 0u) << "no window in the range: empty";
  EXPECT_EQ(none.duration_ns, 0u);
  EXPECT_EQ(load(2500, 3500).total(), 3u) << "kinds stay apart: the off-CPU window adds nothing on-CPU";
  EXPECT_EQ(load(2500, 3500, CountKind::kOffCpu).total(), 900u);
  EXPECT_EQ(load(0, UINT64_MAX).total(), 15u) << "a range past the store's integers is clamped, not wrapped";
  // Any window is a part of the whole: the sum over the windows equals the whole recording.
  EXPECT_EQ(load(0, 2000).total() + load(2000, 3000).total(), load({}, {}).total());
}

TEST(Store, TimeRangeKeepsTheOverlappingWindows) {
  TempDir d;
  auto st = Store::open_sqlite(d.file("s.db"), Store::Mode::kCreateOrAppend);
  ASSERT_TRUE(st) << st.error().message;
  check_time_range(**st);
}

// The same on ClickHouse when a server is given (STRATA_TEST_CLICKHOUSE=clickhouse://HOST:PORT, a
// throwaway database per run). A unit run has none and skips; tests/cluster/cluster_test.py
// (clickhouse) runs this test against the server it starts and fails if it does not pass.
TEST(Store, TimeRangeOnClickHouse) {
  const char* url = std::getenv("STRATA_TEST_CLICKHOUSE");
  if (!url || !*url) GTEST_SKIP() << "set STRATA_TEST_CLICKHOUSE=clickhouse://HOST:PORT to run against ClickHouse";
  auto st = Store::open_clickhouse(std::string(url) + "/strata_unit_" + std::to_string(getpid()),
                                   Store::Mode::kCreateOrAppend);
  ASSERT_TRUE(st) << st.error().message;
  check_time_range(**st);
}

TEST(Store, RoundTripsStacksCountsAndProcesses) {
  TempDir d;
  auto st = Store::open_sqlite(d.file("s.db"), Store::Mode::kCreateOrAppend);
  ASSERT_TRUE(st) << st.error().message;
  auto& s = **st;
  auto rec = s.begin_recording({"node-1", "app", 1000, 99, 10});
  ASSERT_TRUE(rec);
  ProcessInfo p;
  p.pid = 42;
  p.node = "node-1";
  p.comm = "app";
  p.command = "app --x";
  p.rank = 3;
  ASSERT_TRUE(s.put_process(*rec, p));
  Stack a = {native("leaf", 0x10), native("main", 0x20)};
  Stack b = {native("other", 0x30), native("main", 0x20)};
  auto ia = s.intern_stack(a);
  auto ia2 = s.intern_stack(a);
  auto ib = s.intern_stack(b);
  ASSERT_TRUE(ia && ia2 && ib);
  EXPECT_EQ(*ia, *ia2) << "the same stack is stored once";
  EXPECT_NE(*ia, *ib);
  ASSERT_TRUE(s.put_window(*rec, 1000, 2000, CountKind::kOnCpu,
                           {{42, 42, "app", *ia, 5}, {42, 43, "worker", *ib, 7}}));
  ASSERT_TRUE(s.put_window(*rec, 2000, 3000, CountKind::kOnCpu, {{42, 42, "app", *ia, 3}}));
  ASSERT_TRUE(s.end_recording(*rec, 3000));

  auto prof = s.load_profile({});
  ASSERT_TRUE(prof) << prof.error().message;
  EXPECT_EQ(prof->total(), 15u);
  EXPECT_EQ(prof->period_ns, 1'000'000'000u / 99);
  ProfileFilter by_tid;
  by_tid.tid = 43;
  EXPECT_EQ(s.load_profile(by_tid)->total(), 7u);
  ProfileFilter by_rank;
  by_rank.rank = 3;
  EXPECT_EQ(s.load_profile(by_rank)->total(), 15u);
  by_rank.rank = 4;
  EXPECT_EQ(s.load_profile(by_rank)->total(), 0u);
  ProfileFilter off;
  off.kind = CountKind::kOffCpu;
  EXPECT_EQ(s.load_profile(off)->total(), 0u);

  // Frames come back leaf first with their symbols.
  for (size_t i = 0; i < prof->samples.size(); ++i) {
    const auto& stack = prof->stacks[prof->samples[i].stack_index];
    ASSERT_EQ(stack.size(), 2u);
    EXPECT_EQ(stack[1].function, "main");
  }
  auto procs = s.processes();
  ASSERT_TRUE(procs);
  ASSERT_EQ(procs->size(), 1u);
  EXPECT_EQ((*procs)[0].rank, 3);
  EXPECT_EQ((*procs)[0].command, "app --x");
}

TEST(Store, AppendsAndReadsBackAcrossOpens) {
  TempDir d;
  {
    auto st = Store::open_sqlite(d.file("s.db"), Store::Mode::kCreateOrAppend);
    ASSERT_TRUE(st);
    auto rec = (*st)->begin_recording({"n", "a", 1, 99, 10});
    auto id = (*st)->intern_stack({native("f", 1)});
    ASSERT_TRUE((*st)->put_window(*rec, 1, 2, CountKind::kOnCpu, {{1, 1, "a", *id, 4}}));
  }
  {
    auto st = Store::open_sqlite(d.file("s.db"), Store::Mode::kCreateOrAppend);
    ASSERT_TRUE(st) << st.error().message;
    auto rec = (*st)->begin_recording({"n", "b", 5, 99, 10});
    auto id = (*st)->intern_stack({native("f", 1)});
    ASSERT_TRUE((*st)->put_window(*rec, 5, 6, CountKind::kOnCpu, {{2, 2, "b", *id, 6}}));
    EXPECT_EQ(*(*st)->latest_recording(), std::optional<int64_t>(2));
  }
  auto ro = Store::open_sqlite(d.file("s.db"), Store::Mode::kReadOnly);
  ASSERT_TRUE(ro);
  EXPECT_EQ((*ro)->load_profile({})->total(), 10u);
  ProfileFilter first;
  first.recording = 1;
  EXPECT_EQ((*ro)->load_profile(first)->total(), 4u);
  EXPECT_EQ((*ro)->load_profile(first)->stacks.size(), 1u);
}

TEST(Store, UnsymbolizedFramesAreFilledOnce) {
  TempDir d;
  auto st = Store::open_sqlite(d.file("s.db"), Store::Mode::kCreateOrAppend);
  ASSERT_TRUE(st);
  Frame f = native("", 0x99);
  ASSERT_TRUE((*st)->intern_stack({f}));
  auto rows = (*st)->unsymbolized_frames();
  ASSERT_TRUE(rows);
  ASSERT_EQ(rows->size(), 1u);
  (*rows)[0].frame.function = "resolved";
  ASSERT_TRUE((*st)->update_frame_symbols(*rows));
  EXPECT_TRUE((*st)->unsymbolized_frames()->empty());
}

std::string write_file(const TempDir& d, const std::string& name, const std::string& content) {
  std::string path = d.file(name);
  FILE* f = fopen(path.c_str(), "wb");
  fwrite(content.data(), 1, content.size(), f);
  fclose(f);
  return path;
}

TEST(Store, RefusesForeignAndCorruptFilesWithoutTouchingThem) {
  TempDir d;
  std::string text = write_file(d, "text.db", "hello, this is not a database\n");
  std::string trunc = write_file(d, "trunc.db", std::string("SQLite format 3\0", 16) + std::string(50, 'x'));
  std::string foreign = d.file("foreign.db");
  sqlite3* db = nullptr;
  sqlite3_open(foreign.c_str(), &db);
  sqlite3_exec(db, "CREATE TABLE users(id INTEGER, name TEXT); INSERT INTO users VALUES(1,'x');", nullptr,
               nullptr, nullptr);
  sqlite3_close(db);
  for (const auto& path : {text, trunc, foreign}) {
    std::string before = test::slurp(path);
    for (auto mode : {Store::Mode::kReadOnly, Store::Mode::kCreateOrAppend}) {
      auto st = Store::open_sqlite(path, mode);
      ASSERT_FALSE(st) << path;
      EXPECT_NE(st.error().message.find(path), std::string::npos) << st.error().message;
      EXPECT_NE(st.error().message.find("strata store"), std::string::npos) << st.error().message;
    }
    EXPECT_EQ(test::slurp(path), before) << path << " was modified";
  }
  auto missing = Store::open_sqlite(d.file("missing.db"), Store::Mode::kReadOnly);
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find("no such file"), std::string::npos);
}

TEST(Store, RefusesANewerSchema) {
  TempDir d;
  {
    auto st = Store::open_sqlite(d.file("s.db"), Store::Mode::kCreateOrAppend);
    ASSERT_TRUE(st);
  }
  sqlite3* db = nullptr;
  sqlite3_open(d.file("s.db").c_str(), &db);
  sqlite3_exec(db, "UPDATE meta SET value='999' WHERE key='schema_version'", nullptr, nullptr, nullptr);
  sqlite3_close(db);
  auto st = Store::open_sqlite(d.file("s.db"), Store::Mode::kReadOnly);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("newer strata"), std::string::npos) << st.error().message;
}

}  // namespace
}  // namespace strata::store
