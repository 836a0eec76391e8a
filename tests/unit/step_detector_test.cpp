// Step detection from collective patterns, on made-up call sequences.
#include <gtest/gtest.h>

#include "agent/comm/step_detector.h"

namespace strata::agent {
namespace {

constexpr uint64_t kMs = 1'000'000;

// `steps` iterations of: a gap of `gap_ms` (load + forward), then `sigs` collectives each taking
// 2 ms with 1 ms between them.
std::vector<CollectiveCall> make(int steps, const std::vector<std::string>& sigs, uint64_t gap_ms,
                                 uint64_t t0 = 1000 * kMs) {
  std::vector<CollectiveCall> calls;
  uint64_t t = t0;
  for (int s = 0; s < steps; ++s) {
    t += gap_ms * kMs;
    for (const auto& sig : sigs) {
      CollectiveCall c;
      c.signature = sig;
      c.enter_ns = t;
      c.exit_ns = t + 100'000;
      c.done_ns = t + 2 * kMs;
      calls.push_back(c);
      t += 3 * kMs;
    }
  }
  return calls;
}

std::vector<DetectedStep> run(const std::vector<CollectiveCall>& calls, bool final = true) {
  StepDetector d(500 * kMs);
  std::vector<DetectedStep> out;
  for (const auto& c : calls) {
    d.add(c);
    for (auto& s : d.take_steps()) out.push_back(s);
  }
  for (auto& s : d.take_steps(final)) out.push_back(s);
  return out;
}

TEST(StepDetector, DistinctBucketsGiveOneStepPerIteration) {
  auto steps = run(make(20, {"ar:100", "ar:200", "ar:300"}, 40));
  ASSERT_EQ(steps.size(), 20u);
  for (size_t i = 1; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i].calls, 3u);
    EXPECT_EQ(steps[i].start_ns, steps[i - 1].end_ns);
    EXPECT_NEAR(static_cast<double>(steps[i].end_ns - steps[i].start_ns), 40.0 * kMs + 3 * 3 * kMs - kMs, kMs);
  }
}

TEST(StepDetector, IdenticalBucketsAreGroupedByTheStepGap) {
  // DDP with equal-sized buckets: the signatures repeat every call, the gaps every third call.
  auto steps = run(make(30, {"ar:256k", "ar:256k", "ar:256k"}, 50));
  ASSERT_EQ(steps.size(), 30u);
  EXPECT_EQ(steps[5].calls, 3u);
}

TEST(StepDetector, OneCollectivePerStep) {
  auto steps = run(make(25, {"ar:1m"}, 30));
  EXPECT_EQ(steps.size(), 25u);
}

TEST(StepDetector, InitialBroadcastIsNotAStep) {
  auto calls = make(1, {"bcast:params"}, 5);
  auto rest = make(15, {"ar:1", "ar:2"}, 30, calls.back().done_ns + kMs);
  calls.insert(calls.end(), rest.begin(), rest.end());
  auto steps = run(calls);
  ASSERT_EQ(steps.size(), 15u);
  EXPECT_GE(steps[0].start_ns, calls[0].done_ns) << "step 1 starts after the broadcast";
}

TEST(StepDetector, NoPatternNoSteps) {
  std::vector<CollectiveCall> calls;
  for (int i = 0; i < 40; ++i) {
    CollectiveCall c;
    c.signature = "op:" + std::to_string(i);
    c.enter_ns = static_cast<uint64_t>(i) * 10 * kMs;
    c.exit_ns = c.enter_ns + kMs;
    calls.push_back(c);
  }
  EXPECT_TRUE(run(calls).empty());
}

TEST(StepDetector, APatternChangeNeitherHangsNorLosesTheNewSteps) {
  // Training, then evaluation with a different pattern, then identical calls with irregular gaps
  // (a regression: the final flush used to re-find the same pattern forever).
  auto calls = make(10, {"ar:1", "ar:2"}, 30);
  auto eval = make(10, {"ar:1", "ar:2", "ag:3"}, 30, calls.back().done_ns + kMs);
  calls.insert(calls.end(), eval.begin(), eval.end());
  uint64_t t = calls.back().done_ns;
  for (int i = 0; i < 40; ++i) {
    CollectiveCall c;
    c.signature = "allreduce:0::-1";
    t += static_cast<uint64_t>((i * 7919) % 13 + 1) * kMs;
    c.enter_ns = t;
    c.exit_ns = c.done_ns = t + kMs;
    calls.push_back(c);
  }
  auto steps = run(calls);
  EXPECT_GE(steps.size(), 19u);
  for (size_t i = 1; i < steps.size(); ++i) EXPECT_GE(steps[i].start_ns, steps[i - 1].end_ns);
}

TEST(StepDetector, ShortRunsAreDecidedWhenTheProcessEnds) {
  EXPECT_EQ(run(make(6, {"ar:1m"}, 30), /*final=*/true).size(), 6u);
}

TEST(StepDetector, UnconfirmedLastStepWaitsUnlessFinal) {
  auto calls = make(10, {"a", "b"}, 20);
  EXPECT_EQ(run(calls, /*final=*/false).size(), 9u);
  EXPECT_EQ(run(calls, /*final=*/true).size(), 10u);
}

}  // namespace
}  // namespace strata::agent
