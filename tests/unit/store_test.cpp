// The SQLite store: round trips, interning, filters, and refusing what is not a strata store (the
// time range also on ClickHouse, when a server is given).
#include <gtest/gtest.h>
#include <httplib.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <type_traits>
#include <variant>

#include "store/catalog.h"
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
    return prof ? *prof : Profile{};
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

// Several nodes' profiles read together (load_profiles: the past of every node of a job, one read
// on ClickHouse) are what each filter reads alone: the same samples, periods and stacks, and each
// profile spans its own node's windows in its own range (another node's windows start elsewhere).
void check_profiles_together(Store& s) {
  ASSERT_TRUE(s.begin());
  auto r1 = s.begin_recording({"node-1", "app", 1000, 99, 10});
  auto r2 = s.begin_recording({"node-2", "app", 1000, 49, 10});
  auto r3 = s.begin_recording({"node-2", "app", 1000, 99, 10});  // the node's agent restarted
  ASSERT_TRUE(r1 && r2 && r3);
  auto a = s.intern_stack({native("leaf", 0x10), native("main", 0x20)});
  auto b = s.intern_stack({native("other", 0x30), native("main", 0x20)});
  auto c = s.intern_stack({native("third", 0x40)});
  ASSERT_TRUE(a && b && c);
  // node-1: windows at 1000, 2000 and 3000 (the last off-CPU only); node-2: at 1500 and 2500, in two
  // recordings; the same pid on both nodes.
  ASSERT_TRUE(s.put_window(*r1, 1000, 2000, CountKind::kOnCpu, {{42, 42, "app", *a, 5}, {42, 43, "w", *b, 7}}));
  ASSERT_TRUE(s.put_window(*r1, 2000, 3000, CountKind::kOnCpu, {{42, 42, "app", *a, 3}}, {24, kUnwindingCfi}));
  ASSERT_TRUE(s.put_window(*r1, 3000, 4000, CountKind::kOffCpu, {{42, 42, "app", *b, 900}}));
  ASSERT_TRUE(s.put_window(*r2, 1500, 2500, CountKind::kOnCpu, {{42, 42, "app", *c, 11}}));
  ASSERT_TRUE(s.put_window(*r2, 1500, 2500, CountKind::kOffCpu, {{42, 42, "app", *a, 400}}));
  ASSERT_TRUE(s.put_window(*r3, 2500, 3500, CountKind::kOnCpu, {{42, 42, "app", *c, 2}, {42, 42, "app", *a, 1}}));
  ASSERT_TRUE(s.end_recording(*r1, 4000));
  ASSERT_TRUE(s.end_recording(*r2, 2500));
  ASSERT_TRUE(s.end_recording(*r3, 3500));
  auto committed = s.commit();
  ASSERT_TRUE(committed) << committed.error().message;

  auto filter = [](const std::string& node, uint64_t from, uint64_t to, CountKind kind) {
    ProfileFilter f;
    f.node = node;
    f.from_ns = from;
    f.to_ns = to;
    f.kind = kind;
    return f;
  };
  std::vector<ProfileFilter> fs;
  for (auto kind : {CountKind::kOnCpu, CountKind::kOffCpu}) {
    fs.push_back(filter("node-1", 1500, 3500, kind));
    fs.push_back(filter("node-2", 0, 2000, kind));
    fs.push_back(filter("node-2", 2600, 9000, kind));
    fs.push_back(filter("node-3", 0, 9000, kind));  // no such node: empty
  }
  auto together = s.load_profiles(fs);
  ASSERT_TRUE(together) << together.error().message;
  ASSERT_EQ(together->size(), fs.size());
  // A sample as a comparable line: where, which stack (by its frames), how many, at what period.
  auto lines = [](const Profile& p) {
    std::vector<std::string> out;
    for (const auto& smp : p.samples) {
      std::string frames;
      if (smp.stack_index < p.stacks.size())
        for (const auto& f : p.stacks[smp.stack_index]) frames += f.function + ";";
      out.push_back(smp.node + " " + std::to_string(smp.pid) + " " + std::to_string(smp.tid) + " " + smp.comm + " " +
                    frames + " " + std::to_string(smp.count) + " " + std::to_string(p.period_of(smp)));
    }
    std::sort(out.begin(), out.end());
    return out;
  };
  for (size_t i = 0; i < fs.size(); ++i) {
    SCOPED_TRACE("filter " + std::to_string(i) + " (" + *fs[i].node + ")");
    auto alone = s.load_profile(fs[i]);
    ASSERT_TRUE(alone) << alone.error().message;
    const Profile& t = (*together)[i];
    EXPECT_EQ(lines(t), lines(*alone));
    EXPECT_EQ(t.kind, alone->kind);
    EXPECT_EQ(t.period_ns, alone->period_ns);
    EXPECT_EQ(t.duration_ns, alone->duration_ns);
    if (alone->duration_ns > 0) {
      EXPECT_EQ(t.start_ns, alone->start_ns);
    }
  }
  // Each node's span is its own windows': node-1 from 1500 to 3500 holds its windows 1000-4000;
  // node-2 up to 2000 holds its one window 1500-2500 of either kind.
  EXPECT_EQ((*together)[0].start_ns, 1000u);
  EXPECT_EQ((*together)[0].duration_ns, 3000u);
  EXPECT_EQ((*together)[0].total(), 15u) << "node-1's on-CPU samples of 1000-3000";
  EXPECT_EQ((*together)[1].start_ns, 1500u);
  EXPECT_EQ((*together)[1].duration_ns, 1000u);
  EXPECT_EQ((*together)[1].total(), 11u);
  EXPECT_EQ((*together)[2].total(), 3u) << "node-2's second recording";
  EXPECT_EQ((*together)[3].total(), 0u);
  EXPECT_EQ((*together)[3].duration_ns, 0u);
  EXPECT_EQ((*together)[4].total(), 900u);
  EXPECT_EQ((*together)[5].total(), 400u);
  EXPECT_EQ((*together)[6].total(), 0u) << "node-2 has no off-CPU window after 2600";
  EXPECT_EQ((*together)[6].duration_ns, 1000u) << "... but its on-CPU window 2500-3500 is in the span";
}

// Sampled launches and memory calls read back (query_launch_samples): by the time span (the rows of
// the windows that overlap it), by name prefix, node and page, each with its window, node and its
// stack resolved leaf first. The same checks run on every backend.
void check_launch_samples(Store& s) {
  ASSERT_TRUE(s.begin());
  auto r1 = s.begin_recording({"node-1", "app", 1000, 99, 10});
  auto r2 = s.begin_recording({"node-2", "app", 1000, 99, 10});
  ASSERT_TRUE(r1 && r2);
  Frame runtime = native("cudaMemcpy", 0x99);
  runtime.module = "/usr/lib/libcudart.so.13";
  auto copy = s.intern_stack({runtime, native("copy_loop", 0x10), native("main", 0x20)});
  auto gemm = s.intern_stack({native("launch_gemm", 0x30), native("main", 0x20)});
  ASSERT_TRUE(copy && gemm);
  ASSERT_TRUE(s.put_launch_samples(*r1, 1000, 2000, {{42, 42, "[cudaMemcpy]", *copy, 5}, {42, 42, "gemm", *gemm, 3}}));
  ASSERT_TRUE(s.put_launch_samples(*r1, 2000, 3000, {{42, 43, "[cudaMalloc]", *gemm, 2}}));
  ASSERT_TRUE(s.put_launch_samples(*r2, 2000, 3000, {{42, 42, "[cudaMemcpy]", *copy, 7}}));
  ASSERT_TRUE(s.end_recording(*r1, 3000));
  ASSERT_TRUE(s.end_recording(*r2, 3000));
  auto committed = s.commit();
  ASSERT_TRUE(committed) << committed.error().message;

  auto read = [&](RowQuery q) {
    auto r = s.query_launch_samples(q);
    EXPECT_TRUE(r) << r.error().message;
    return r ? *r : LaunchSamples{};
  };
  auto counts = [](const LaunchSamples& l) {
    std::string o;
    for (const auto& r : l.rows) o += r.node + ":" + r.sample.kernel + "=" + std::to_string(r.sample.count) + " ";
    return o;
  };
  const LaunchSamples all = read({});
  EXPECT_EQ(counts(all), "node-1:[cudaMemcpy]=5 node-1:gemm=3 node-1:[cudaMalloc]=2 node-2:[cudaMemcpy]=7 ")
      << "in time order, then node, pid, tid, name";
  ASSERT_EQ(all.stacks.size(), 2u) << "each stack the rows name, once";
  for (const auto& r : all.rows) {
    ASSERT_LT(r.stack_index, all.stacks.size());
    const Stack& st = all.stacks[r.stack_index];
    ASSERT_FALSE(st.empty());
    EXPECT_EQ(st.back().function, "main") << "leaf first, root last";
    if (r.sample.kernel == "[cudaMemcpy]") {
      ASSERT_EQ(st.size(), 3u);
      EXPECT_EQ(st[0].function, "cudaMemcpy");
      EXPECT_EQ(st[0].module, "/usr/lib/libcudart.so.13");
      EXPECT_EQ(st[1].function, "copy_loop");
    }
  }
  EXPECT_EQ(all.rows[0].start_ns, 1000u);
  EXPECT_EQ(all.rows[0].end_ns, 2000u);
  EXPECT_EQ(all.rows[2].sample.tid, 43u);
  EXPECT_EQ(all.rows[0].sample.stack_id, *copy);

  RowQuery memory;
  memory.prefix = "[";
  EXPECT_EQ(counts(read(memory)), "node-1:[cudaMemcpy]=5 node-1:[cudaMalloc]=2 node-2:[cudaMemcpy]=7 ")
      << "the prefix keeps the memory calls";
  RowQuery later;
  later.from_ns = 2000;
  EXPECT_EQ(counts(read(later)), "node-1:[cudaMalloc]=2 node-2:[cudaMemcpy]=7 ")
      << "windows are half-open: [1000, 2000) ends where 2000 starts";
  RowQuery earlier;
  earlier.to_ns = 2000;
  EXPECT_EQ(counts(read(earlier)), "node-1:[cudaMemcpy]=5 node-1:gemm=3 ");
  RowQuery inside;
  inside.from_ns = 1500;
  inside.to_ns = 1600;
  EXPECT_EQ(counts(read(inside)), "node-1:[cudaMemcpy]=5 node-1:gemm=3 ") << "a span inside a window keeps the window";
  RowQuery node;
  node.node = "node-2";
  node.pid = 42;
  EXPECT_EQ(counts(read(node)), "node-2:[cudaMemcpy]=7 ") << "pids repeat across nodes: the node picks one";
  RowQuery page;
  page.prefix = "[";
  page.offset = 1;
  page.limit = 1;
  const LaunchSamples one = read(page);
  EXPECT_EQ(counts(one), "node-1:[cudaMalloc]=2 ");
  ASSERT_EQ(one.rows.size(), 1u);
  ASSERT_LT(one.rows[0].stack_index, one.stacks.size());
  EXPECT_EQ(one.stacks[one.rows[0].stack_index].front().function, "launch_gemm") << "a page's rows keep their stacks";
  RowQuery none;
  none.from_ns = 5000;
  const LaunchSamples empty = read(none);
  EXPECT_TRUE(empty.rows.empty() && empty.stacks.empty());
}

// Identity: pids repeat across nodes. Two nodes' processes with the same pid keep their own rows
// (steps, collectives, device activity, metrics, samples), each read back with its node, and a
// node filter picks one.
void check_node_identity(Store& s) {
  ASSERT_TRUE(s.begin());
  std::map<std::string, int64_t> rec;
  auto a = s.intern_stack({native("leaf_a", 0x10), native("main", 0x20)});
  auto b = s.intern_stack({native("leaf_b", 0x30), native("main", 0x20)});
  ASSERT_TRUE(a && b);
  int k = 0;
  for (const std::string node : {"node-a", "node-b"}) {
    ++k;  // node-a's rows: 1 of each; node-b's: 2 of each
    auto r = s.begin_recording({node, "app", 1000, 99, 10});
    ASSERT_TRUE(r) << r.error().message;
    rec[node] = *r;
    ProcessInfo p;
    p.pid = 42;
    p.node = node;
    p.rank = k - 1;
    ASSERT_TRUE(s.put_process(*r, p));
    std::vector<StepRecord> steps;
    std::vector<CollectiveRecord> colls;
    std::vector<DeviceActivity> dev;
    std::vector<Metric> metrics;
    for (int i = 0; i < k; ++i) {
      StepRecord st;
      st.pid = 42;
      st.step = static_cast<uint64_t>(i + 1);
      st.start_ns = 1000 + static_cast<uint64_t>(i) * 100;
      st.end_ns = st.start_ns + 50 * static_cast<uint64_t>(k);
      steps.push_back(st);
      CollectiveRecord c;
      c.pid = 42;
      c.op = "allreduce";
      c.seq = static_cast<uint64_t>(i + 1);
      c.enter_ns = st.start_ns;
      c.exit_ns = st.end_ns;
      colls.push_back(c);
      DeviceActivity d;
      d.pid = 42;
      d.kind = "kernel";
      d.name = "k" + node;
      d.start_ns = st.start_ns;
      d.end_ns = st.end_ns;
      dev.push_back(d);
      metrics.push_back({42, "os.runq_wait_us", "", static_cast<double>(k)});
    }
    ASSERT_TRUE(s.put_steps(*r, steps));
    ASSERT_TRUE(s.put_collectives(*r, colls));
    ASSERT_TRUE(s.put_device_activity(*r, dev));
    ASSERT_TRUE(s.put_metrics(*r, 1000, 2000, metrics));
    ASSERT_TRUE(s.put_communicators(*r, {{42, 7, "comm", k - 1, 2, 1000}}));
    ASSERT_TRUE(s.put_window(*r, 1000, 2000, CountKind::kOnCpu, {{42, 42, "app", k == 1 ? *a : *b, static_cast<uint64_t>(5 * k)}}));
  }
  auto committed = s.commit();
  ASSERT_TRUE(committed) << committed.error().message;

  auto steps = s.steps();
  ASSERT_TRUE(steps) << steps.error().message;
  ASSERT_EQ(steps->size(), 3u);
  std::map<std::string, size_t> per_node;
  for (const auto& st : *steps) per_node[st.node]++;
  EXPECT_EQ(per_node["node-a"], 1u);
  EXPECT_EQ(per_node["node-b"], 2u);
  for (const std::string node : {"node-a", "node-b"}) {
    const size_t want = node == "node-a" ? 1 : 2;
    RowQuery q;
    q.node = node;
    q.pid = 42;
    auto st = s.query_steps(q);
    ASSERT_TRUE(st) << st.error().message;
    EXPECT_EQ(st->size(), want) << node;
    for (const auto& x : *st) {
      EXPECT_EQ(x.node, node);
      EXPECT_EQ(x.end_ns - x.start_ns, 50 * want) << "node-b's step under node-a's name";
    }
    auto colls = s.query_collectives(q);
    ASSERT_TRUE(colls) << colls.error().message;
    EXPECT_EQ(colls->size(), want);
    auto dev = s.query_device_activity(q);
    ASSERT_TRUE(dev) << dev.error().message;
    ASSERT_EQ(dev->size(), want);
    EXPECT_EQ((*dev)[0].name, "k" + node);
    q.prefix = "os.";
    auto m = s.query_metrics(q);
    ASSERT_TRUE(m) << m.error().message;
    ASSERT_EQ(m->size(), want);
    EXPECT_EQ((*m)[0].metric.value, static_cast<double>(want));
    EXPECT_EQ((*m)[0].node, node);
    ProfileFilter f;
    f.node = node;
    f.pid = 42;
    auto prof = s.load_profile(f);
    ASSERT_TRUE(prof) << prof.error().message;
    EXPECT_EQ(prof->total(), 5 * want);
    ASSERT_EQ(prof->samples.size(), 1u);
    EXPECT_EQ(prof->samples[0].node, node);
    EXPECT_EQ(prof->stacks[prof->samples[0].stack_index][0].function, node == "node-a" ? "leaf_a" : "leaf_b");
  }
  // Without a node, pid 42 is both processes, each sample still with its node.
  ProfileFilter both;
  both.pid = 42;
  auto prof = s.load_profile(both);
  ASSERT_TRUE(prof);
  EXPECT_EQ(prof->total(), 15u);
  EXPECT_EQ(prof->samples.size(), 2u) << "the same pid, tid and comm on two nodes are two samples";
  auto comms = s.communicators();
  ASSERT_TRUE(comms);
  ASSERT_EQ(comms->size(), 2u);
  EXPECT_NE((*comms)[0].node, (*comms)[1].node);
  auto threads = s.thread_windows();
  ASSERT_TRUE(threads);
  ASSERT_EQ(threads->size(), 2u);
  EXPECT_NE((*threads)[0].node, (*threads)[1].node);
  // One process's thread tracks (a rank's timeline), by node and pid, in a span or not.
  for (const std::string node : {"node-a", "node-b"}) {
    RowQuery one;
    one.node = node;
    one.pid = 42;
    auto mine = s.thread_windows(one);
    ASSERT_TRUE(mine) << mine.error().message;
    ASSERT_EQ(mine->size(), 1u) << node;
    EXPECT_EQ((*mine)[0].node, node);
    EXPECT_EQ((*mine)[0].samples, node == "node-a" ? 5u : 10u);
    one.from_ns = 1500;
    one.to_ns = 1600;
    mine = s.thread_windows(one);
    ASSERT_TRUE(mine) << mine.error().message;
    EXPECT_EQ(mine->size(), 1u) << "the window overlaps the span";
    one.from_ns = 2000;  // the window ended then
    one.to_ns.reset();
    mine = s.thread_windows(one);
    ASSERT_TRUE(mine) << mine.error().message;
    EXPECT_TRUE(mine->empty());
  }
  RowQuery other;
  other.pid = 43;
  auto none = s.thread_windows(other);
  ASSERT_TRUE(none) << none.error().message;
  EXPECT_TRUE(none->empty());
  // Paging: in time order, a page at a time.
  RowQuery page;
  page.limit = 2;
  auto p1 = s.query_steps(page);
  page.offset = 2;
  auto p2 = s.query_steps(page);
  ASSERT_TRUE(p1 && p2);
  EXPECT_EQ(p1->size(), 2u);
  EXPECT_EQ(p2->size(), 1u);
  RowQuery late;
  late.from_ns = 1100;
  auto l = s.query_steps(late);
  ASSERT_TRUE(l);
  EXPECT_EQ(l->size(), 1u) << "only node-b's second step ends after 1100";
}

// A profile of many distinct stacks (a large job's window): read back whole. ClickHouse refused
// the query past ~13k stacks when their ids were listed in its text (256 KiB); it is checked at
// 100k. SQLite, which never listed them, at 10k (its interning is the slow part here).
void check_many_stacks(Store& s, int kStacks) {
  ASSERT_TRUE(s.begin());
  auto rec = s.begin_recording({"node-1", "app", 1000, 99, 10});
  ASSERT_TRUE(rec);
  std::vector<StackCount> counts;
  counts.reserve(kStacks);
  for (int i = 0; i < kStacks; ++i) {
    auto id = s.intern_stack({native("f" + std::to_string(i), 0x1000 + static_cast<uint64_t>(i)), native("main", 0x20)});
    ASSERT_TRUE(id) << id.error().message;
    counts.push_back({42, 42, "app", *id, 1});
  }
  ASSERT_TRUE(s.put_window(*rec, 1000, 2000, CountKind::kOnCpu, counts));
  auto committed = s.commit();
  ASSERT_TRUE(committed) << committed.error().message;
  auto prof = s.load_profile({});
  ASSERT_TRUE(prof) << prof.error().message;
  EXPECT_EQ(prof->total(), static_cast<uint64_t>(kStacks));
  ASSERT_EQ(prof->stacks.size(), static_cast<size_t>(kStacks));
  size_t whole = 0;
  for (const auto& st : prof->stacks) whole += st.size() == 2 && st[1].function == "main" ? 1 : 0;
  EXPECT_EQ(whole, static_cast<size_t>(kStacks));
}

// Issue 19: each window keeps the rate and unwinding its samples were taken with; a profile over
// windows at 99, 24 and 49 Hz weighs each sample by its window's period (10 s of CPU in each window
// reads as 10 s, whatever the count), and the reduced windows are told as runs. The same checks run
// on every backend.
constexpr uint64_t kSecond = 1'000'000'000ull;
void check_fidelity(Store& s) {
  ASSERT_TRUE(s.begin());
  auto rec = s.begin_recording({"node-1", "app", kSecond, 99, 10});
  ASSERT_TRUE(rec) << rec.error().message;
  ProcessInfo p;
  p.pid = 42;
  p.node = "node-1";
  p.rank = 0;
  ASSERT_TRUE(s.put_process(*rec, p));
  auto a = s.intern_stack({native("leaf", 0x10), native("main", 0x20)});
  ASSERT_TRUE(a);
  // 10 s windows, each 10 s of one thread's CPU: 990 samples at 99 Hz, 240 at 24 Hz, 490 at 49 Hz.
  const WindowFidelity full{99, kUnwindingCfi}, quarter{24, kUnwindingFramePointers}, half{49, kUnwindingCfi};
  ASSERT_TRUE(s.put_window(*rec, 1 * kSecond, 11 * kSecond, CountKind::kOnCpu, {{42, 42, "app", *a, 990}}, full));
  ASSERT_TRUE(s.put_window(*rec, 11 * kSecond, 21 * kSecond, CountKind::kOnCpu, {{42, 42, "app", *a, 240}}, quarter));
  ASSERT_TRUE(s.put_window(*rec, 21 * kSecond, 31 * kSecond, CountKind::kOnCpu, {{42, 42, "app", *a, 240}}, quarter));
  ASSERT_TRUE(s.put_window(*rec, 31 * kSecond, 41 * kSecond, CountKind::kOnCpu, {{42, 42, "app", *a, 490}}, half));
  ASSERT_TRUE(s.put_window(*rec, 41 * kSecond, 51 * kSecond, CountKind::kOnCpu, {{42, 42, "app", *a, 990}}, full));
  // Off-CPU windows are measured, not sampled: they say no rate and are never "reduced".
  ASSERT_TRUE(s.put_window(*rec, 11 * kSecond, 21 * kSecond, CountKind::kOffCpu, {{42, 42, "app", *a, 900}}));
  ASSERT_TRUE(s.end_recording(*rec, 51 * kSecond));
  auto committed = s.commit();
  ASSERT_TRUE(committed) << committed.error().message;

  auto prof = s.load_profile({});
  ASSERT_TRUE(prof) << prof.error().message;
  EXPECT_EQ(prof->period_ns, kSecond / 99);
  EXPECT_EQ(prof->total(), 990u + 240 + 240 + 490 + 990) << "raw counts are kept";
  std::map<uint64_t, uint64_t> by_period;  // period -> samples
  double cpu_s = 0;
  for (const auto& smp : prof->samples) {
    by_period[prof->period_of(smp)] += smp.count;
    cpu_s += static_cast<double>(smp.count * prof->period_of(smp)) / 1e9;
  }
  EXPECT_EQ(by_period, (std::map<uint64_t, uint64_t>{{kSecond / 99, 1980}, {kSecond / 49, 490}, {kSecond / 24, 480}}));
  EXPECT_NEAR(cpu_s, 50.0, 0.01) << "five windows of 10 s of CPU each";
  EXPECT_NEAR(prof->weighted_total(), 50.0 * 99, 1.0) << "in samples at 99 Hz";
  EXPECT_TRUE(prof->mixed_periods());

  // A time range of one reduced window: its own period.
  ProfileFilter one;
  one.from_ns = 12 * kSecond;
  one.to_ns = 13 * kSecond;
  auto w2 = s.load_profile(one);
  ASSERT_TRUE(w2) << w2.error().message;
  ASSERT_EQ(w2->samples.size(), 1u);
  EXPECT_EQ(w2->period_of(w2->samples[0]), kSecond / 24);

  auto runs = s.reduced_fidelity();
  ASSERT_TRUE(runs) << runs.error().message;
  ASSERT_EQ(runs->size(), 2u);
  const ReducedFidelity& q = (*runs)[0];
  EXPECT_EQ(q.node, "node-1");
  EXPECT_EQ(q.recording, *rec);
  EXPECT_EQ(q.start_ns, 11 * kSecond);
  EXPECT_EQ(q.end_ns, 31 * kSecond);
  EXPECT_EQ(q.windows, 2u);
  EXPECT_EQ(q.configured_hz, 99u);
  EXPECT_EQ(q.sample_hz, 24u);
  EXPECT_EQ(q.unwinding, kUnwindingFramePointers);
  const ReducedFidelity& h = (*runs)[1];
  EXPECT_EQ(h.start_ns, 31 * kSecond);
  EXPECT_EQ(h.end_ns, 41 * kSecond);
  EXPECT_EQ(h.windows, 1u);
  EXPECT_EQ(h.sample_hz, 49u);
  EXPECT_EQ(h.unwinding, kUnwindingCfi);
  auto procs = s.processes();
  ASSERT_TRUE(procs);
  EXPECT_EQ(describe_reduced_fidelity(q, *procs),
            "node-1 (rank 0), 1970-01-01 00:00:11 - 00:00:31 UTC, 2 windows: 24 Hz instead of 99 Hz; frame pointers only "
            "(CFI unwinding off)");
  // A span keeps the reduced windows that overlap it: a page's, not every window the store holds.
  auto late = s.reduced_fidelity(std::nullopt, 32 * kSecond, 40 * kSecond);
  ASSERT_TRUE(late) << late.error().message;
  ASSERT_EQ(late->size(), 1u);
  EXPECT_EQ(late->front().sample_hz, 49u);
  auto early = s.reduced_fidelity(std::nullopt, 0, 12 * kSecond);
  ASSERT_TRUE(early) << early.error().message;
  ASSERT_EQ(early->size(), 1u);
  EXPECT_EQ(early->front().start_ns, 11 * kSecond);
  EXPECT_EQ(early->front().end_ns, 21 * kSecond);
  EXPECT_EQ(early->front().windows, 1u);
  auto none = s.reduced_fidelity(std::nullopt, 45 * kSecond, 50 * kSecond);
  ASSERT_TRUE(none) << none.error().message;
  EXPECT_TRUE(none->empty());

  auto threads = s.thread_windows();
  ASSERT_TRUE(threads) << threads.error().message;
  std::vector<unsigned> rates;
  for (const auto& t : *threads) rates.push_back(t.sample_hz);
  EXPECT_EQ(rates, (std::vector<unsigned>{99, 24, 24, 49, 99}));
}

TEST(Store, WindowFidelityRoundTrip) {
  TempDir d;
  auto st = Store::open_sqlite(d.file("s.db"), Store::Mode::kCreateOrAppend);
  ASSERT_TRUE(st) << st.error().message;
  check_fidelity(**st);
}

// RowQuery::any_order (the diagnosis sums device activity per process): the same rows as the
// ordered read, on either store; a page (limit) keeps the store's order, asked for in any order or not.
void check_any_order(Store& s) {
  ASSERT_TRUE(s.begin());
  auto rec = s.begin_recording({"node-1", "app", kSecond, 99, 10});
  ASSERT_TRUE(rec) << rec.error().message;
  std::vector<DeviceActivity> rows;
  for (uint32_t pid : {7u, 3u, 5u}) {
    for (uint64_t i = 0; i < 40; ++i) {
      DeviceActivity d;
      d.pid = pid;
      d.kind = "kernel";
      d.name = "k" + std::to_string(i % 4);
      d.start_ns = 100 * kSecond + (97 * i + pid) % 40 * kSecond / 10;  // out of time order, per pid
      d.end_ns = d.start_ns + 1000 + i;
      d.correlation = pid * 1000 + i;
      rows.push_back(d);
    }
  }
  ASSERT_TRUE(s.put_device_activity(*rec, rows));
  ASSERT_TRUE(s.end_recording(*rec, 200 * kSecond));
  auto committed = s.commit();
  ASSERT_TRUE(committed) << committed.error().message;
  RowQuery q;
  q.from_ns = 100 * kSecond;
  q.to_ns = 110 * kSecond;
  auto keys = [](const std::vector<DeviceActivity>& v) {
    std::vector<std::pair<uint32_t, uint64_t>> k;
    for (const auto& d : v) k.emplace_back(d.pid, d.correlation);
    return k;
  };
  auto sorted = s.query_device_activity(q);
  ASSERT_TRUE(sorted) << sorted.error().message;
  q.any_order = true;
  auto any = s.query_device_activity(q);
  ASSERT_TRUE(any) << any.error().message;
  EXPECT_EQ(sorted->size(), rows.size());
  auto a = keys(*any), b = keys(*sorted);
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  EXPECT_EQ(a, b);
  q.limit = 5;
  auto page = s.query_device_activity(q);
  ASSERT_TRUE(page) << page.error().message;
  ASSERT_EQ(page->size(), 5u);
  auto p = keys(*page), first = keys(*sorted);
  EXPECT_TRUE(std::equal(p.begin(), p.end(), first.begin())) << "a page is in the store's order";
}

TEST(Store, AReadInAnyOrderReturnsTheSameRows) {
  TempDir d;
  auto st = Store::open_sqlite(d.file("s.db"), Store::Mode::kCreateOrAppend);
  ASSERT_TRUE(st) << st.error().message;
  check_any_order(**st);
}

// A file from before the fidelity columns: read only, its windows are at the recording's rate and
// nothing is reduced; opened for writing, the columns are added and new windows keep theirs.
TEST(Store, WindowFidelityColumnsAreAddedToAnOlderFile) {
  TempDir d;
  const std::string path = d.file("old.db");
  {
    auto st = Store::open_sqlite(path, Store::Mode::kCreateOrAppend);
    ASSERT_TRUE(st) << st.error().message;
    auto& s = **st;
    ASSERT_TRUE(s.begin());
    auto rec = s.begin_recording({"node-1", "app", kSecond, 99, 10});
    ASSERT_TRUE(rec);
    auto a = s.intern_stack({native("leaf", 0x10)});
    ASSERT_TRUE(a);
    ASSERT_TRUE(s.put_window(*rec, kSecond, 2 * kSecond, CountKind::kOnCpu, {{42, 42, "app", *a, 7}}, {24, kUnwindingFramePointers}));
    ASSERT_TRUE(s.commit());
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "ALTER TABLE windows DROP COLUMN sample_hz; ALTER TABLE windows DROP COLUMN unwinding;",
                         nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
  sqlite3_close(db);
  {
    auto st = Store::open_sqlite(path, Store::Mode::kReadOnly);
    ASSERT_TRUE(st) << st.error().message;
    auto prof = (*st)->load_profile({});
    ASSERT_TRUE(prof) << prof.error().message;
    ASSERT_EQ(prof->samples.size(), 1u);
    EXPECT_EQ(prof->period_of(prof->samples[0]), kSecond / 99) << "no rate said: the recording's";
    auto runs = (*st)->reduced_fidelity();
    ASSERT_TRUE(runs);
    EXPECT_TRUE(runs->empty());
  }
  auto st = Store::open_sqlite(path, Store::Mode::kCreateOrAppend);
  ASSERT_TRUE(st) << st.error().message;
  auto& s = **st;
  ASSERT_TRUE(s.begin());
  auto a = s.intern_stack({native("leaf", 0x10)});
  ASSERT_TRUE(a);
  ASSERT_TRUE(s.put_window(1, 2 * kSecond, 3 * kSecond, CountKind::kOnCpu, {{42, 42, "app", *a, 2}}, {24, kUnwindingCfi}));
  ASSERT_TRUE(s.commit());
  auto runs = s.reduced_fidelity();
  ASSERT_TRUE(runs) << runs.error().message;
  ASSERT_EQ(runs->size(), 1u);
  EXPECT_EQ(runs->front().start_ns, 2 * kSecond);
  EXPECT_EQ(runs->front().sample_hz, 24u);
}

// The names of the indexes SQLite keeps on a table of the file at `path`.
std::set<std::string> indexes_of(const std::string& path, const char* table) {
  std::set<std::string> out;
  sqlite3* db = nullptr;
  const int opened = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
  EXPECT_EQ(opened, SQLITE_OK) << path << ": " << sqlite3_errmsg(db);
  if (opened != SQLITE_OK) {
    sqlite3_close(db);
    return out;
  }
  sqlite3_stmt* s = nullptr;
  std::string sql = std::string("SELECT name FROM sqlite_master WHERE type='index' AND tbl_name='") + table + "'";
  const int prepared = sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr);
  EXPECT_EQ(prepared, SQLITE_OK) << sqlite3_errmsg(db);
  if (prepared == SQLITE_OK) {
    while (sqlite3_step(s) == SQLITE_ROW) out.insert(reinterpret_cast<const char*>(sqlite3_column_text(s, 0)));
  }
  sqlite3_finalize(s);
  sqlite3_close(db);
  return out;
}

// Metric rows are two thirds of a collector's rows. An index that sends each one to its name's
// place (no read used it) made ingest cost grow with the job's age; the time index appends.
TEST(Store, MetricsAreIndexedByTheirEndAloneAndAnOlderFileLosesItsNameIndex) {
  TempDir d;
  const std::string path = d.file("m.db");
  auto put = [&](uint64_t start) {
    auto st = Store::open_sqlite(path, Store::Mode::kCreateOrAppend);
    ASSERT_TRUE(st) << st.error().message;
    auto& s = **st;
    ASSERT_TRUE(s.begin());
    auto rec = s.begin_recording({"node-1", "app", kSecond, 99, 10});
    ASSERT_TRUE(rec);
    ASSERT_TRUE(s.put_metrics(*rec, start, start + kSecond, {{42, "os.cpu_ns", "", 5}, {42, "os.runq_ns", "", 7}}));
    ASSERT_TRUE(s.commit());
  };
  put(kSecond);
  EXPECT_EQ(indexes_of(path, "metrics"), (std::set<std::string>{"metrics_by_end"}));

  // A file written before: the name index is there.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "CREATE INDEX metrics_by_name ON metrics(name, recording_id)", nullptr, nullptr, nullptr),
            SQLITE_OK) << sqlite3_errmsg(db);
  sqlite3_close(db);
  {
    auto st = Store::open_sqlite(path, Store::Mode::kReadOnly);
    ASSERT_TRUE(st) << st.error().message;
    auto rows = (*st)->query_metrics({});
    ASSERT_TRUE(rows) << rows.error().message;
    EXPECT_EQ(rows->size(), 2u);
  }
  EXPECT_TRUE(indexes_of(path, "metrics").count("metrics_by_name")) << "a read-only open changes nothing";

  put(3 * kSecond);  // opened for writing: dropped, and every row is still there
  EXPECT_EQ(indexes_of(path, "metrics"), (std::set<std::string>{"metrics_by_end"}));
  auto st = Store::open_sqlite(path, Store::Mode::kReadOnly);
  ASSERT_TRUE(st) << st.error().message;
  RowQuery q;
  q.prefix = "os.runq";
  auto rows = (*st)->query_metrics(q);
  ASSERT_TRUE(rows) << rows.error().message;
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[0].metric.value, 7);
  EXPECT_EQ((*rows)[1].start_ns, 3 * kSecond);
}

// One process's collectives and device activity are found by the hour they began in (an index led
// by the process made ingest cost grow with the file), its stacks by window; a span's rows that began
// in the hour before it are still found, and an older file loses its process-led indexes.
TEST(Store, OneProcessesRowsAreFoundHourByHourAndAnOlderFileLosesItsProcessIndexes) {
  constexpr uint64_t kHour = 3600 * kSecond;
  TempDir d;
  const std::string path = d.file("h.db");
  auto put = [&](const std::string& node, uint32_t pid, uint64_t enter, uint64_t exit) {
    auto st = Store::open_sqlite(path, Store::Mode::kCreateOrAppend);
    ASSERT_TRUE(st) << st.error().message;
    auto& s = **st;
    ASSERT_TRUE(s.begin());
    auto rec = s.begin_recording({node, "app", enter, 99, 10});
    ASSERT_TRUE(rec);
    CollectiveRecord c;
    c.pid = pid;
    c.op = "allreduce";
    c.enter_ns = enter;
    c.exit_ns = exit;
    DeviceActivity a;
    a.pid = pid;
    a.kind = "kernel";
    a.start_ns = enter;
    a.end_ns = exit;
    ASSERT_TRUE(s.put_collectives(*rec, {c}));
    ASSERT_TRUE(s.put_device_activity(*rec, {a}));
    auto stack = s.intern_stack({native("leaf", 0x10)});
    ASSERT_TRUE(stack);
    ASSERT_TRUE(s.put_window(*rec, enter, exit, CountKind::kOnCpu, {{pid, pid, "app", *stack, pid}}));
    ASSERT_TRUE(s.commit());
  };
  put("node-1", 7, kSecond, 2 * kSecond);                        // hour 0
  put("node-1", 7, 2 * kHour - kSecond, 2 * kHour + kSecond);    // began in hour 1, ends in hour 2
  put("node-1", 7, 5 * kHour, 5 * kHour + kSecond);              // hour 5
  put("node-1", 8, 2 * kHour, 2 * kHour + kSecond);              // another process
  put("node-2", 7, 2 * kHour, 2 * kHour + kSecond);              // the same pid on another node
  EXPECT_EQ(indexes_of(path, "collectives"), (std::set<std::string>{"collectives_by_end", "collectives_by_hour_pid"}));
  EXPECT_EQ(indexes_of(path, "device_activity"),
            (std::set<std::string>{"device_activity_by_end", "device_activity_by_hour_pid"}));
  EXPECT_EQ(indexes_of(path, "stack_counts"), (std::set<std::string>{"stack_counts_by_window"}));

  auto check = [&](const char* when) {
    SCOPED_TRACE(when);
    auto st = Store::open_sqlite(path, Store::Mode::kReadOnly);
    ASSERT_TRUE(st) << st.error().message;
    auto& s = **st;
    auto starts = [&](std::optional<uint64_t> from, std::optional<uint64_t> to, const char* node = "node-1") {
      RowQuery q;
      q.node = node;
      q.pid = 7;
      q.from_ns = from;
      q.to_ns = to;
      auto colls = s.query_collectives(q);
      auto dev = s.query_device_activity(q);
      EXPECT_TRUE(colls && dev);
      std::vector<uint64_t> out, dev_out;
      if (!colls || !dev) return out;
      for (const auto& c : *colls) out.push_back(c.enter_ns);
      for (const auto& a : *dev) dev_out.push_back(a.start_ns);
      EXPECT_EQ(out, dev_out);
      return out;
    };
    EXPECT_EQ(starts({}, {}), (std::vector<uint64_t>{kSecond, 2 * kHour - kSecond, 5 * kHour}));
    EXPECT_EQ(starts(2 * kHour, 3 * kHour), (std::vector<uint64_t>{2 * kHour - kSecond}));
    EXPECT_EQ(starts({}, kHour), (std::vector<uint64_t>{kSecond}));
    EXPECT_EQ(starts(3 * kHour, {}), (std::vector<uint64_t>{5 * kHour}));
    EXPECT_EQ(starts(6 * kHour, {}), (std::vector<uint64_t>{}));
    EXPECT_EQ(starts({}, {}, "node-2"), (std::vector<uint64_t>{2 * kHour}));
    auto old = s.collectives(std::nullopt, 7);  // both nodes' pid 7
    ASSERT_TRUE(old) << old.error().message;
    EXPECT_EQ(old->size(), 4u);

    ProfileFilter f;
    f.pid = 7;
    f.node = "node-1";
    auto p = s.load_profile(f);
    ASSERT_TRUE(p) << p.error().message;
    uint64_t samples = 0;
    for (const auto& x : p->samples) {
      EXPECT_EQ(x.pid, 7u);
      samples += x.count;
    }
    EXPECT_EQ(samples, 21u);  // three windows of node-1's pid 7
    f.node.reset();
    p = s.load_profile(f);
    ASSERT_TRUE(p) << p.error().message;
    samples = 0;
    for (const auto& x : p->samples) samples += x.count;
    EXPECT_EQ(samples, 28u);
  };
  check("a new file");

  // A file written before: indexes led by the process.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  for (const char* sql : {"DROP INDEX collectives_by_hour_pid", "DROP INDEX device_activity_by_hour_pid",
                          "CREATE INDEX collectives_by_pid ON collectives(recording_id, pid, enter_ns)",
                          "CREATE INDEX device_activity_by_pid ON device_activity(recording_id, pid, start_ns)",
                          "CREATE INDEX stack_counts_by_pid ON stack_counts(recording_id, pid)"}) {
    ASSERT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, nullptr), SQLITE_OK) << sql << ": " << sqlite3_errmsg(db);
  }
  sqlite3_close(db);
  check("an older file, read only");
  EXPECT_TRUE(indexes_of(path, "collectives").count("collectives_by_pid")) << "a read-only open changes nothing";

  put("node-3", 9, 6 * kHour, 6 * kHour + kSecond);  // opened for writing: replaced
  EXPECT_EQ(indexes_of(path, "collectives"), (std::set<std::string>{"collectives_by_end", "collectives_by_hour_pid"}));
  EXPECT_EQ(indexes_of(path, "device_activity"),
            (std::set<std::string>{"device_activity_by_end", "device_activity_by_hour_pid"}));
  EXPECT_EQ(indexes_of(path, "stack_counts"), (std::set<std::string>{"stack_counts_by_window"}));
  check("an older file, opened for writing");
}

TEST(Store, NodeQualifiedIdentity) {
  TempDir d;
  auto st = Store::open_sqlite(d.file("s.db"), Store::Mode::kCreateOrAppend);
  ASSERT_TRUE(st) << st.error().message;
  check_node_identity(**st);
}

// One node's profile of a span reads that node's recordings and windows, never every recording the
// file holds: its full-table scan steps do not grow with the other nodes' recordings. (A hang's
// stall stacks are read node by node: at 1,000 nodes, 2,000 reads in a round, each of which scanned
// every recording, so a collector's rounds grew slower with every job its store had seen.)
TEST(Store, ANodesProfileScansNoOtherNodesRecordings) {
  TempDir d;
  auto st = Store::open_sqlite(d.file("s.db"), Store::Mode::kCreateOrAppend);
  ASSERT_TRUE(st) << st.error().message;
  Store& s = **st;
  ASSERT_TRUE(s.begin());
  auto a = s.intern_stack({native("leaf", 0x10), native("main", 0x20)});
  ASSERT_TRUE(a);
  constexpr int kNodes = 300;
  for (int n = 0; n < kNodes; ++n) {
    auto rec = s.begin_recording({"node-" + std::to_string(n), "app", 1000, 99, 10});
    ASSERT_TRUE(rec) << rec.error().message;
    ASSERT_TRUE(s.put_window(*rec, 1000, 2000, CountKind::kOnCpu, {{42, 42, "app", *a, 5}}));
    ASSERT_TRUE(s.put_window(*rec, 2000, 3000, CountKind::kOnCpu, {{42, 42, "app", *a, static_cast<uint64_t>(n + 1)}}));
  }
  auto committed = s.commit();
  ASSERT_TRUE(committed) << committed.error().message;
  ProfileFilter f;
  f.node = "node-7";
  f.from_ns = 2000;
  f.kind = CountKind::kOnCpu;
  const uint64_t before = sqlite_full_scan_steps();
  auto p = s.load_profile(f);
  const uint64_t scanned = sqlite_full_scan_steps() - before;
  ASSERT_TRUE(p) << p.error().message;
  ASSERT_EQ(p->samples.size(), 1u);
  EXPECT_EQ(p->samples[0].node, "node-7");
  EXPECT_EQ(p->samples[0].count, 8u);  // its window of the span only
  EXPECT_LT(scanned, static_cast<uint64_t>(kNodes)) << "a node's profile stepped through a table of every node's rows";
}

// The catalog (store/catalog.h): every column of a kind described there survives each way a row
// travels: the ingest message (agent -> collector), the store's insert and both of its reads, and
// the query API's JSON. Each column gets a value of its own, so a column written in another's place
// or left out shows; a field added to the catalog is checked here without a new line.
template <typename Row, typename Msg, size_t N>
Row distinct_row(const catalog::Column<Row, Msg> (&columns)[N]) {
  Row r;
  uint64_t v = 1000;
  for (const auto& c : columns) {
    ++v;
    std::visit(
        [&](auto m) {
          using T = catalog::MemberType<Row, decltype(m)>;
          if constexpr (std::is_same_v<T, std::string>) r.*m = "v" + std::to_string(v);
          else if constexpr (std::is_same_v<T, bool>) r.*m = true;  // the default is false
          else r.*m = static_cast<T>(v);
        },
        c.member);
  }
  return r;
}

template <typename Row, typename Msg, size_t N>
void expect_same_columns(const catalog::Column<Row, Msg> (&columns)[N], const Row& want, const Row& got,
                         const std::string& how) {
  for (const auto& c : columns)
    std::visit([&](auto m) { EXPECT_EQ(want.*m, got.*m) << how << ": column " << c.name; }, c.member);
}

// Writes `want` with `put` into a new recording of node-7 and reads it back with each of `reads`
// (every column, and the recording's node).
template <typename Row, typename Msg, size_t N>
void check_kind_round_trip(Store& s, const catalog::Column<Row, Msg> (&columns)[N], const Row& want,
                           const std::function<Status(Store&, int64_t)>& put,
                           const std::map<std::string, std::function<Result<std::vector<Row>>(Store&)>>& reads) {
  ASSERT_TRUE(s.begin());
  auto rec = s.begin_recording({"node-7", "app", 1000, 99, 10});
  ASSERT_TRUE(rec) << rec.error().message;
  auto st = put(s, *rec);
  ASSERT_TRUE(st) << st.error().message;
  auto committed = s.commit();
  ASSERT_TRUE(committed) << committed.error().message;
  for (const auto& [how, read] : reads) {
    auto got = read(s);
    ASSERT_TRUE(got) << how << ": " << got.error().message;
    ASSERT_EQ(got->size(), 1u) << how;
    expect_same_columns(columns, want, got->front(), how);
  }
}

template <typename Row>
auto all_of(Result<std::vector<Row>> (Reader::*read)(std::optional<int64_t>, std::optional<uint32_t>)) {
  return [read](Store& s) { return (s.*read)(std::nullopt, std::nullopt); };
}
template <typename Row>
auto bounded(Result<std::vector<Row>> (Reader::*read)(const RowQuery&)) {
  return [read](Store& s) { return (s.*read)(RowQuery{}); };
}

void check_catalog_round_trip(Store& s) {
  const StepRecord step = distinct_row(catalog::kSteps);
  check_kind_round_trip<StepRecord>(
      s, catalog::kSteps, step, [&](Store& st, int64_t rec) { return st.put_steps(rec, {step}); },
      {{"steps()", all_of(&Reader::steps)}, {"query_steps()", bounded(&Reader::query_steps)}});
  auto nodes = s.query_steps({});
  ASSERT_TRUE(nodes && !nodes->empty());
  EXPECT_EQ(nodes->front().node, "node-7") << "a row's node is its recording's";

  const CollectiveRecord coll = distinct_row(catalog::kCollectives);
  check_kind_round_trip<CollectiveRecord>(
      s, catalog::kCollectives, coll, [&](Store& st, int64_t rec) { return st.put_collectives(rec, {coll}); },
      {{"collectives()", all_of(&Reader::collectives)}, {"query_collectives()", bounded(&Reader::query_collectives)}});

  const DeviceActivity dev = distinct_row(catalog::kDeviceActivity);
  check_kind_round_trip<DeviceActivity>(
      s, catalog::kDeviceActivity, dev, [&](Store& st, int64_t rec) { return st.put_device_activity(rec, {dev}); },
      {{"device_activity()", all_of(&Reader::device_activity)},
       {"query_device_activity()", bounded(&Reader::query_device_activity)}});

  const CommunicatorRecord comm = distinct_row(catalog::kCommunicators);
  check_kind_round_trip<CommunicatorRecord>(
      s, catalog::kCommunicators, comm, [&](Store& st, int64_t rec) { return st.put_communicators(rec, {comm}); },
      {{"communicators()", [](Store& st) { return st.communicators(); }}});

  // Metrics are counted per window: the row read back also carries the window.
  const Metric metric = distinct_row(catalog::kMetrics);
  auto metric_rows = [](Result<std::vector<Reader::MetricRow>> r) -> Result<std::vector<Metric>> {
    if (!r) return r.error();
    std::vector<Metric> out;
    for (const auto& m : *r) {
      EXPECT_EQ(m.start_ns, 5000u);
      EXPECT_EQ(m.end_ns, 6000u);
      EXPECT_EQ(m.node, "node-7");
      out.push_back(m.metric);
    }
    return out;
  };
  check_kind_round_trip<Metric>(
      s, catalog::kMetrics, metric, [&](Store& st, int64_t rec) { return st.put_metrics(rec, 5000, 6000, {metric}); },
      {{"metrics()", [&](Store& st) { return metric_rows(st.metrics("")); }},
       {"query_metrics()", [&](Store& st) { return metric_rows(st.query_metrics({})); }}});

  // Launch samples too; their stack_id names a stack the store has (put sets it before the rows are
  // compared: `want` is this very row).
  LaunchSample launch = distinct_row(catalog::kLaunchSamples);
  check_kind_round_trip<LaunchSample>(
      s, catalog::kLaunchSamples, launch,
      [&](Store& st, int64_t rec) -> Status {
        auto id = st.intern_stack({native("launch_site", 0x40)});
        if (!id) return id.error();
        launch.stack_id = *id;
        return st.put_launch_samples(rec, 5000, 6000, {launch});
      },
      {{"query_launch_samples()", [](Store& st) -> Result<std::vector<LaunchSample>> {
          auto r = st.query_launch_samples({});
          if (!r) return r.error();
          std::vector<LaunchSample> out;
          for (const auto& x : r->rows) {
            EXPECT_EQ(x.start_ns, 5000u);
            EXPECT_EQ(x.node, "node-7");
            EXPECT_LT(x.stack_index, r->stacks.size());
            if (x.stack_index < r->stacks.size()) {
              EXPECT_EQ(r->stacks[x.stack_index].front().function, "launch_site");
            }
            out.push_back(x.sample);
          }
          return out;
        }}});
}

// Every column of a kind survives the ingest message (agent -> collector) and shows in its JSON.
template <typename Msg, typename Row, size_t N>
void check_message_round_trip(const catalog::Column<Row, Msg> (&columns)[N]) {
  const Row row = distinct_row(columns);
  Msg m;
  catalog::to_message(columns, row, m);
  Msg wire;
  ASSERT_TRUE(wire.ParseFromString(m.SerializeAsString()));
  expect_same_columns(columns, row, catalog::from_message<Row>(columns, wire), "ingest " + std::string(Msg::descriptor()->name()));
  const std::string json = "{" + catalog::json_members(columns, row).substr(1) + "}";
  for (const auto& c : columns)
    EXPECT_NE(json.find("\"" + std::string(c.name) + "\":"), std::string::npos) << "the JSON row lacks " << c.name;
}

TEST(Catalog, EveryColumnTravelsThroughTheIngestMessage) {
  check_message_round_trip(catalog::kSteps);
  check_message_round_trip(catalog::kCollectives);
  check_message_round_trip(catalog::kDeviceActivity);
  check_message_round_trip(catalog::kCommunicators);
  check_message_round_trip(catalog::kMetrics);
  check_message_round_trip(catalog::kLaunchSamples);
  const StepRecord step = distinct_row(catalog::kSteps);
  EXPECT_NE(catalog::json_members(catalog::kSteps, step).find("\"device_known\":true"), std::string::npos);
}

TEST(Catalog, EveryColumnRoundTripsThroughSqlite) {
  TempDir d;
  auto st = Store::open_sqlite(d.file("s.db"), Store::Mode::kCreateOrAppend);
  ASSERT_TRUE(st) << st.error().message;
  check_catalog_round_trip(**st);
}

// "name TYPE NOT NULL, ..." of a table of a new file.
std::string sqlite_columns(const std::string& path, const std::string& table) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* q = nullptr;
  const std::string sql = "SELECT name, type, \"notnull\" FROM pragma_table_info('" + table + "')";
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &q, nullptr), SQLITE_OK);
  std::string got;
  while (sqlite3_step(q) == SQLITE_ROW)
    got += std::string(reinterpret_cast<const char*>(sqlite3_column_text(q, 0))) + " " +
           reinterpret_cast<const char*>(sqlite3_column_text(q, 1)) + (sqlite3_column_int(q, 2) ? " NOT NULL" : "") + ", ";
  sqlite3_finalize(q);
  sqlite3_close(db);
  return got;
}

// Files written before the catalog keep being read: the tables the catalog creates start with the
// columns, types and order the hand-written schema had (a renamed or reordered catalog line fails here).
TEST(Catalog, TheTablesKeepTheirColumns) {
  TempDir d;
  // The hand-written columns come first, in their order; a field added since comes after them.
  auto expect_starts_with = [](const std::string& path, const std::string& table, const std::string& want) {
    const std::string got = sqlite_columns(path, table);
    EXPECT_EQ(got.substr(0, want.size()), want) << table;
  };
  {
    auto st = Store::open_sqlite(d.file("s.db"), Store::Mode::kCreateOrAppend);
    ASSERT_TRUE(st) << st.error().message;
  }
  expect_starts_with(d.file("s.db"), "steps",
            "recording_id INTEGER NOT NULL, pid INTEGER NOT NULL, step INTEGER NOT NULL, start_ns INTEGER NOT NULL, "
            "end_ns INTEGER NOT NULL, collective_ns INTEGER NOT NULL, device_collective_ns INTEGER NOT NULL, "
            "device_compute_ns INTEGER NOT NULL, gpu_idle_ns INTEGER NOT NULL, device_known INTEGER NOT NULL, ");
  expect_starts_with(d.file("s.db"), "collectives",
            "recording_id INTEGER NOT NULL, pid INTEGER NOT NULL, tid INTEGER NOT NULL, library TEXT NOT NULL, "
            "op TEXT NOT NULL, comm_id TEXT NOT NULL, comm_handle INTEGER NOT NULL, seq INTEGER NOT NULL, "
            "count INTEGER NOT NULL, dtype INTEGER NOT NULL, bytes INTEGER NOT NULL, redop INTEGER NOT NULL, "
            "peer INTEGER NOT NULL, stream INTEGER NOT NULL, enter_ns INTEGER NOT NULL, exit_ns INTEGER NOT NULL, "
            "device_start_ns INTEGER NOT NULL, device_end_ns INTEGER NOT NULL, completion TEXT NOT NULL, "
            "ret INTEGER NOT NULL, ");
  expect_starts_with(d.file("s.db"), "device_activity",
            "recording_id INTEGER NOT NULL, pid INTEGER NOT NULL, device INTEGER NOT NULL, kind TEXT NOT NULL, "
            "name TEXT NOT NULL, stream INTEGER NOT NULL, start_ns INTEGER NOT NULL, end_ns INTEGER NOT NULL, "
            "api_ns INTEGER NOT NULL, api_tid INTEGER NOT NULL, correlation INTEGER NOT NULL, bytes INTEGER NOT NULL, ");
  expect_starts_with(d.file("s.db"), "communicators",
            "recording_id INTEGER NOT NULL, pid INTEGER NOT NULL, handle INTEGER NOT NULL, comm_id TEXT NOT NULL, "
            "rank INTEGER NOT NULL, nranks INTEGER NOT NULL, init_ns INTEGER NOT NULL, ");
  expect_starts_with(d.file("s.db"), "metrics",
            "recording_id INTEGER NOT NULL, start_ns INTEGER NOT NULL, end_ns INTEGER NOT NULL, pid INTEGER NOT NULL, "
            "name TEXT NOT NULL, label TEXT NOT NULL, value REAL NOT NULL, ");
  expect_starts_with(d.file("s.db"), "launch_samples",
            "recording_id INTEGER NOT NULL, start_ns INTEGER NOT NULL, end_ns INTEGER NOT NULL, pid INTEGER NOT NULL, "
            "tid INTEGER NOT NULL, kernel TEXT NOT NULL, stack_id INTEGER NOT NULL, count INTEGER NOT NULL, ");
}

// The catalog's older-store tests, on either store: one step and one collective written before
// the columns are dropped ...
void write_step_and_collective(Store& st, const StepRecord& step, const CollectiveRecord& coll) {
  ASSERT_TRUE(st.begin());
  auto rec = st.begin_recording({"node-7", "app", 1000, 99, 10});
  ASSERT_TRUE(rec);
  ASSERT_TRUE(st.put_steps(*rec, {step}));
  ASSERT_TRUE(st.put_collectives(*rec, {coll}));
  ASSERT_TRUE(st.commit());
}

// ... and read back, once steps.gpu_idle_ns and collectives.completion are gone, by a store opened
// read only: those two as their defaults, the rest as written.
void expect_missing_columns_read_as_defaults(Store& st, const StepRecord& step, const CollectiveRecord& coll) {
  auto steps = st.steps();
  ASSERT_TRUE(steps) << steps.error().message;
  ASSERT_EQ(steps->size(), 1u);
  EXPECT_EQ(steps->front().gpu_idle_ns, 0u) << "a column the store lacks reads as its default";
  EXPECT_EQ(steps->front().device_compute_ns, step.device_compute_ns) << "the others as written";
  EXPECT_EQ(steps->front().node, "node-7");
  auto colls = st.query_collectives({});
  ASSERT_TRUE(colls) << colls.error().message;
  ASSERT_EQ(colls->size(), 1u);
  EXPECT_EQ(colls->front().completion, "");
  EXPECT_EQ(colls->front().comm_id, coll.comm_id);
}

// A column added to a catalog kind reaches files written before it, with no line of its own in the
// stores: such a file opened read only reads it as its default (0, ''); opened for writing it gets
// the column. The file here loses two columns (DROP COLUMN), as a file older than them lacks them.
TEST(Catalog, AnOlderFileWithoutAColumnReadsItsDefaultAndGetsTheColumn) {
  TempDir d;
  const std::string path = d.file("s.db");
  const StepRecord step = distinct_row(catalog::kSteps);
  const CollectiveRecord coll = distinct_row(catalog::kCollectives);
  {
    auto st = Store::open_sqlite(path, Store::Mode::kCreateOrAppend);
    ASSERT_TRUE(st) << st.error().message;
    write_step_and_collective(**st, step, coll);
  }
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    char* why = nullptr;
    EXPECT_EQ(sqlite3_exec(db, "ALTER TABLE steps DROP COLUMN gpu_idle_ns; ALTER TABLE collectives DROP COLUMN completion;",
                           nullptr, nullptr, &why),
              SQLITE_OK)
        << (why ? why : "");
    sqlite3_free(why);
    sqlite3_close(db);
  }
  ASSERT_EQ(sqlite_columns(path, "steps").find("gpu_idle_ns"), std::string::npos);
  {
    auto st = Store::open_sqlite(path, Store::Mode::kReadOnly);
    ASSERT_TRUE(st) << st.error().message;
    expect_missing_columns_read_as_defaults(**st, step, coll);
  }
  EXPECT_EQ(sqlite_columns(path, "steps").find("gpu_idle_ns"), std::string::npos) << "read only: the file is not written";
  {
    auto st = Store::open_sqlite(path, Store::Mode::kCreateOrAppend);
    ASSERT_TRUE(st) << st.error().message;
    ASSERT_TRUE((*st)->begin());
    auto rec = (*st)->begin_recording({"node-8", "app", 2000, 99, 10});
    ASSERT_TRUE(rec);
    StepRecord later = step;
    later.step = 2;
    later.gpu_idle_ns = 77;
    ASSERT_TRUE((*st)->put_steps(*rec, {later}));
    ASSERT_TRUE((*st)->commit());
    auto steps = (*st)->steps();
    ASSERT_TRUE(steps) << steps.error().message;
    ASSERT_EQ(steps->size(), 2u);
    for (const auto& x : *steps) EXPECT_EQ(x.gpu_idle_ns, x.step == 2 ? 77u : 0u) << "step " << x.step;
  }
  EXPECT_NE(sqlite_columns(path, "steps").find("gpu_idle_ns INTEGER NOT NULL"), std::string::npos);
  EXPECT_NE(sqlite_columns(path, "collectives").find("completion TEXT NOT NULL"), std::string::npos);
}

TEST(Store, ManyStacks) {
  TempDir d;
  auto st = Store::open_sqlite(d.file("s.db"), Store::Mode::kCreateOrAppend);
  ASSERT_TRUE(st) << st.error().message;
  check_many_stacks(**st, 10'000);
}

// The ClickHouse tests below need a server (STRATA_TEST_CLICKHOUSE=clickhouse://HOST:PORT, a
// throwaway database per test). A unit run has none and skips; tests/cluster/cluster_test.py
// (clickhouse) runs every Store.*OnClickHouse test against the server it starts and fails unless
// each passes.
std::unique_ptr<Store> clickhouse_or_skip(const std::string& name) {
  const char* url = std::getenv("STRATA_TEST_CLICKHOUSE");
  if (!url || !*url) return nullptr;
  auto st = Store::open_clickhouse(std::string(url) + "/strata_unit_" + name + "_" + std::to_string(getpid()),
                                   Store::Mode::kCreateOrAppend);
  EXPECT_TRUE(st) << st.error().message;
  return st ? std::move(*st) : nullptr;
}

TEST(Store, NodeQualifiedIdentityOnClickHouse) {
  auto st = clickhouse_or_skip("identity");
  if (!st) GTEST_SKIP() << "set STRATA_TEST_CLICKHOUSE=clickhouse://HOST:PORT to run against ClickHouse";
  check_node_identity(*st);
}

TEST(Store, ManyStacksOnClickHouse) {
  auto st = clickhouse_or_skip("stacks");
  if (!st) GTEST_SKIP() << "set STRATA_TEST_CLICKHOUSE=clickhouse://HOST:PORT to run against ClickHouse";
  check_many_stacks(*st, 100'000);
}

TEST(Store, CatalogRoundTripOnClickHouse) {
  auto st = clickhouse_or_skip("catalog");
  if (!st) GTEST_SKIP() << "set STRATA_TEST_CLICKHOUSE=clickhouse://HOST:PORT to run against ClickHouse";
  check_catalog_round_trip(*st);
}

TEST(Store, AReadInAnyOrderReturnsTheSameRowsOnClickHouse) {
  auto st = clickhouse_or_skip("any_order");
  if (!st) GTEST_SKIP() << "set STRATA_TEST_CLICKHOUSE=clickhouse://HOST:PORT to run against ClickHouse";
  check_any_order(*st);
}

TEST(Store, WindowFidelityOnClickHouse) {
  auto st = clickhouse_or_skip("fidelity");
  if (!st) GTEST_SKIP() << "set STRATA_TEST_CLICKHOUSE=clickhouse://HOST:PORT to run against ClickHouse";
  check_fidelity(*st);
}

// The catalog's derived columns on a real ClickHouse table made before a column existed (as
// Catalog.AnOlderFileWithoutAColumnReadsItsDefaultAndGetsTheColumn on SQLite): the tables lose two
// columns (DROP COLUMN), as a database older than them lacks them. Read only, the store reads them
// as their defaults and leaves the tables alone; opened for writing, it adds them (ALTER TABLE ADD
// COLUMN from the catalog) and new rows keep their values, while the rows from before read 0 / ''.
TEST(Store, AnOlderCatalogTableGetsItsColumnOnClickHouse) {
  const char* url = std::getenv("STRATA_TEST_CLICKHOUSE");
  if (!url || !*url) GTEST_SKIP() << "set STRATA_TEST_CLICKHOUSE=clickhouse://HOST:PORT to run against ClickHouse";
  const std::string server = std::string(url).substr(std::string("clickhouse://").size());
  const std::string db = "strata_unit_older_" + std::to_string(getpid());
  httplib::Client ch(server.substr(0, server.rfind(':')), std::stoi(server.substr(server.rfind(':') + 1)));
  auto sql = [&](const std::string& q) {
    auto r = ch.Post("/", q, "text/plain");
    EXPECT_TRUE(r && r->status == 200) << q << ": " << (r ? r->body : "no answer");
    return r && r->status == 200 ? r->body : std::string();
  };
  auto columns = [&](const std::string& table) {
    return sql("SELECT name FROM system.columns WHERE database = '" + db + "' AND table = '" + table +
               "' FORMAT TabSeparated");
  };
  const std::string spec = std::string(url) + "/" + db;
  const StepRecord step = distinct_row(catalog::kSteps);
  const CollectiveRecord coll = distinct_row(catalog::kCollectives);
  {
    auto st = Store::open_clickhouse(spec, Store::Mode::kCreateOrAppend);
    ASSERT_TRUE(st) << st.error().message;
    write_step_and_collective(**st, step, coll);
  }
  sql("ALTER TABLE " + db + ".steps DROP COLUMN gpu_idle_ns");
  sql("ALTER TABLE " + db + ".collectives DROP COLUMN completion");
  ASSERT_EQ(columns("steps").find("gpu_idle_ns"), std::string::npos);
  ASSERT_NE(columns("steps").find("device_compute_ns"), std::string::npos);
  {
    auto st = Store::open_clickhouse(spec, Store::Mode::kReadOnly);
    ASSERT_TRUE(st) << st.error().message;
    expect_missing_columns_read_as_defaults(**st, step, coll);
  }
  EXPECT_EQ(columns("steps").find("gpu_idle_ns"), std::string::npos) << "read only: the tables are not altered";
  {
    auto st = Store::open_clickhouse(spec, Store::Mode::kCreateOrAppend);
    ASSERT_TRUE(st) << st.error().message;
    ASSERT_TRUE((*st)->begin());
    auto rec = (*st)->begin_recording({"node-8", "app", 2000, 99, 10});
    ASSERT_TRUE(rec);
    StepRecord later = step;
    later.step = 2;
    later.gpu_idle_ns = 77;
    ASSERT_TRUE((*st)->put_steps(*rec, {later}));
    CollectiveRecord later_coll = coll;
    later_coll.seq = coll.seq + 1;
    later_coll.completion = "device";
    ASSERT_TRUE((*st)->put_collectives(*rec, {later_coll}));
    auto done = (*st)->commit();
    ASSERT_TRUE(done) << done.error().message;
    auto steps = (*st)->steps();
    ASSERT_TRUE(steps) << steps.error().message;
    ASSERT_EQ(steps->size(), 2u);
    for (const auto& x : *steps) EXPECT_EQ(x.gpu_idle_ns, x.step == 2 ? 77u : 0u) << "step " << x.step;
    auto colls = (*st)->query_collectives({});
    ASSERT_TRUE(colls) << colls.error().message;
    ASSERT_EQ(colls->size(), 2u);
    for (const auto& x : *colls) EXPECT_EQ(x.completion, x.seq == coll.seq ? "" : "device") << "seq " << x.seq;
  }
  EXPECT_NE(columns("steps").find("gpu_idle_ns"), std::string::npos);
  EXPECT_NE(columns("collectives").find("completion"), std::string::npos);
  sql("DROP DATABASE " + db);
}

TEST(Store, LaunchSamplesReadBack) {
  TempDir d;
  auto st = Store::open_sqlite(d.file("s.db"), Store::Mode::kCreateOrAppend);
  ASSERT_TRUE(st) << st.error().message;
  check_launch_samples(**st);
}

TEST(Store, ProfilesReadTogetherAreEachFiltersOwn) {
  TempDir d;
  auto st = Store::open_sqlite(d.file("s.db"), Store::Mode::kCreateOrAppend);
  ASSERT_TRUE(st) << st.error().message;
  check_profiles_together(**st);
}

TEST(Store, ProfilesReadTogetherAreEachFiltersOwnOnClickHouse) {
  auto st = clickhouse_or_skip("together");
  if (!st) GTEST_SKIP() << "set STRATA_TEST_CLICKHOUSE=clickhouse://HOST:PORT to run against ClickHouse";
  check_profiles_together(*st);
}

TEST(Store, LaunchSamplesOnClickHouse) {
  auto st = clickhouse_or_skip("launches");
  if (!st) GTEST_SKIP() << "set STRATA_TEST_CLICKHOUSE=clickhouse://HOST:PORT to run against ClickHouse";
  check_launch_samples(*st);
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
