// IngestApplier::apply_group: batches that queued at the collector go into the store in one
// transaction, each still exactly once and with its own outcome; a group the store refuses is
// applied again batch by batch, so only the refused batch fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "proto/ingest_codec.h"
#include "server/ingest_applier.h"
#include "store/store.h"
#include "tests/support/run.h"

namespace strata {
namespace {

using server::IngestApplier;
using test::TempDir;

// The collector's store, with its transactions counted and the steps of one pid refused (a batch
// the store cannot take).
class CountingWriter final : public store::Writer {
 public:
  CountingWriter(store::Store& s, uint32_t refused_pid) : s_(s), refused_pid_(refused_pid) {}
  Result<int64_t> begin_recording(const store::RecordingInfo& i) override { return s_.begin_recording(i); }
  Status end_recording(int64_t r, uint64_t ns) override { return s_.end_recording(r, ns); }
  Status put_process(int64_t r, const store::ProcessInfo& p) override { return s_.put_process(r, p); }
  Result<int64_t> intern_stack(const Stack& st, store::UnwindMethod m) override { return s_.intern_stack(st, m); }
  Status put_window(int64_t r, uint64_t a, uint64_t b, store::CountKind k, const std::vector<store::StackCount>& c,
                    const store::WindowFidelity& f) override {
    return s_.put_window(r, a, b, k, c, f);
  }
  Status put_stat(int64_t r, const std::string& k, double v) override { return s_.put_stat(r, k, v); }
  Status put_metrics(int64_t r, uint64_t a, uint64_t b, const std::vector<store::Metric>& m) override {
    return s_.put_metrics(r, a, b, m);
  }
  Status put_communicators(int64_t r, const std::vector<store::CommunicatorRecord>& x) override {
    return s_.put_communicators(r, x);
  }
  Status put_collectives(int64_t r, const std::vector<store::CollectiveRecord>& x) override {
    return s_.put_collectives(r, x);
  }
  Status put_device_activity(int64_t r, const std::vector<store::DeviceActivity>& x) override {
    return s_.put_device_activity(r, x);
  }
  Status put_steps(int64_t r, const std::vector<store::StepRecord>& x) override {
    for (const auto& s : x)
      if (s.pid == refused_pid_) return Error{"refused: pid " + std::to_string(s.pid)};
    return s_.put_steps(r, x);
  }
  Status put_launch_samples(int64_t r, uint64_t a, uint64_t b, const std::vector<store::LaunchSample>& x) override {
    return s_.put_launch_samples(r, a, b, x);
  }
  Result<std::vector<store::FrameRow>> unsymbolized_frames() override { return s_.unsymbolized_frames(); }
  Status update_frame_symbols(const std::vector<store::FrameRow>& r) override { return s_.update_frame_symbols(r); }
  Status begin() override {
    ++begins;
    return s_.begin();
  }
  Status commit() override {
    ++commits;
    return s_.commit();
  }
  Status rollback() override {
    ++rollbacks;
    return s_.rollback();
  }
  int begins = 0, commits = 0, rollbacks = 0;

 private:
  store::Store& s_;
  uint32_t refused_pid_;
};

// A node's batch: its recording (first batch only), a stack (defined when `define`), a window that
// counts it, and one step per pid.
ingest::Batch batch(const std::string& agent, uint64_t id, std::vector<uint32_t> pids, bool define = true) {
  ingest::Batch b;
  b.set_schema_version(ingest::kIngestVersion);
  b.set_agent_id(agent);
  b.set_node(agent);
  b.set_batch_id(id);
  if (id == 1) b.add_records()->mutable_recording()->set_local_id(1);
  if (define) {
    auto* s = b.add_records()->mutable_stack();
    s->set_local_id(7);
    auto* f = s->add_frames();
    f->set_module("m");
    f->set_offset(7);
    f->set_function(agent + "_f");
  }
  auto* w = b.add_records()->mutable_window();
  w->set_recording(1);
  w->set_start_ns(id * 10);
  w->set_end_ns(id * 10 + 10);
  auto* c = w->add_counts();
  c->set_pid(pids.front());
  c->set_stack(7);
  c->set_value(1);
  auto* steps = b.add_records()->mutable_steps();
  steps->set_recording(1);
  for (uint32_t pid : pids) {
    auto* s = steps->add_rows();
    s->set_pid(pid);
    s->set_step(id);
    s->set_start_ns(id * 10);
    s->set_end_ns(id * 10 + 5);
  }
  return b;
}

// The steps each node has in the store, "node:pid:step" sorted.
std::vector<std::string> stored_steps(store::Store& s) {
  auto steps = s.steps();
  EXPECT_TRUE(steps) << steps.error().message;
  std::vector<std::string> out;
  if (!steps) return out;
  for (const auto& x : *steps) out.push_back(x.node + ":" + std::to_string(x.pid) + ":" + std::to_string(x.step));
  std::sort(out.begin(), out.end());
  return out;
}

TEST(IngestGroup, QueuedBatchesGoInOneTransactionEachExactlyOnce) {
  TempDir tmp;
  auto st = store::Store::open_sqlite(tmp.file("g.db"), store::Store::Mode::kCreateOrAppend);
  ASSERT_TRUE(st) << st.error().message;
  CountingWriter w(**st, /*refused_pid=*/0);
  IngestApplier applier(w, **st);
  const std::string health = "{}";
  // Node a's first batch, node b's, node a's second (its window counts the stack a's first batch
  // defined: found among the group's own new mappings), and a's first again (a resend: a duplicate).
  std::vector<ingest::Batch> batches = {batch("a", 1, {10}), batch("b", 1, {20}), batch("a", 2, {10}, false),
                                        batch("a", 1, {10})};
  std::vector<IngestApplier::GroupItem> items;
  for (const auto& b : batches) items.push_back({&b, &health, 5});
  std::vector<IngestApplier::GroupItem*> group;
  for (auto& i : items) group.push_back(&i);
  applier.apply_group(group);
  EXPECT_EQ(w.begins, 1);
  EXPECT_EQ(w.commits, 1) << "one commit for the group";
  for (size_t i = 0; i < items.size(); ++i) {
    ASSERT_TRUE(items[i].done) << i;
    ASSERT_TRUE(items[i].out) << i << ": " << items[i].out.error().message;
  }
  EXPECT_FALSE(items[0].out->duplicate);
  EXPECT_EQ(items[0].out->rows.at("steps"), 1u);
  EXPECT_EQ(items[2].out->lost_refs, 0u) << "a's second batch found the stack its first defined";
  EXPECT_TRUE(items[3].out->duplicate) << "the resend within the group";
  EXPECT_EQ(stored_steps(**st), (std::vector<std::string>{"a:10:1", "a:10:2", "b:20:1"}));
  // Sent again after the group: duplicates.
  auto again = applier.apply(batches[1], health, 6);
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_TRUE(again->duplicate);
}

TEST(IngestGroup, ABatchTheStoreRefusesFailsAloneAndTheOthersLandOnce) {
  TempDir tmp;
  auto st = store::Store::open_sqlite(tmp.file("g.db"), store::Store::Mode::kCreateOrAppend);
  ASSERT_TRUE(st) << st.error().message;
  CountingWriter w(**st, /*refused_pid=*/666);
  IngestApplier applier(w, **st);
  const std::string health = "{}";
  std::vector<ingest::Batch> batches = {batch("a", 1, {10}), batch("bad", 1, {30, 666}), batch("c", 1, {40})};
  std::vector<IngestApplier::GroupItem> items;
  for (const auto& b : batches) items.push_back({&b, &health, 5});
  std::vector<IngestApplier::GroupItem*> group;
  for (auto& i : items) group.push_back(&i);
  applier.apply_group(group);
  ASSERT_TRUE(items[0].done && items[1].done && items[2].done);
  ASSERT_TRUE(items[0].out) << items[0].out.error().message;
  ASSERT_TRUE(items[2].out) << items[2].out.error().message;
  ASSERT_FALSE(items[1].out);
  EXPECT_NE(items[1].out.error().message.find("refused: pid 666"), std::string::npos) << items[1].out.error().message;
  EXPECT_FALSE(items[0].out->duplicate);
  EXPECT_FALSE(items[2].out->duplicate);
  // The group, rolled back, then each batch alone: two commits, and the refused one rolled back.
  EXPECT_EQ(w.begins, 4);
  EXPECT_EQ(w.commits, 2);
  EXPECT_EQ(w.rollbacks, 2);
  EXPECT_EQ(stored_steps(**st), (std::vector<std::string>{"a:10:1", "c:40:1"})) << "each once, none of the refused";
  // The refused batch was not marked applied: once the store takes it, it lands (not a duplicate).
  CountingWriter fixed(**st, /*refused_pid=*/0);
  IngestApplier later(fixed, **st);
  auto out = later.apply(batches[1], health, 6);
  ASSERT_TRUE(out) << out.error().message;
  EXPECT_FALSE(out->duplicate);
  EXPECT_EQ(stored_steps(**st), (std::vector<std::string>{"a:10:1", "bad:30:1", "bad:666:1", "c:40:1"}));
}

}  // namespace
}  // namespace strata
