// Issue 16: the rows a collector holds for a job's span between rounds (diagnose::HeldRows). Each
// round drops the rows the span moved past and adds the new ones without moving every row held;
// after any sequence of rounds the rows must be exactly what the plain way gets: every held row
// that still ends in the span kept, the new ones merged in the span query's order (stable: of equal
// keys, the row held first). Checked against that plain way on random rounds with what the store
// can hand a round: late rows, rows that began long before the span and end in it, rows with equal
// keys, a row that ends before it starts (a clock step), re-reads by time (cut_ns), and a kind with
// no order (device activity).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <tuple>
#include <vector>

#include "diagnose/loader.h"

namespace strata::diagnose {
namespace {

constexpr uint64_t kSecond = 1'000'000'000ull;

// The plain way: drop, then a stable merge into a new vector (or an append, without an order).
template <typename Row, typename Key>
void plain_merge(std::vector<Row>& held, std::vector<Row> fresh, uint64_t from_ns, uint64_t cut_ns, Key key,
                 bool ordered) {
  std::erase_if(held, [&](const Row& r) {
    const uint64_t e = row_end(r);
    return e <= from_ns || e > cut_ns;
  });
  if (!ordered) {
    held.insert(held.end(), fresh.begin(), fresh.end());
    return;
  }
  std::vector<Row> out;
  std::merge(held.begin(), held.end(), fresh.begin(), fresh.end(), std::back_inserter(out),
             [&](const Row& a, const Row& b) { return key(a) < key(b); });
  held = std::move(out);
}

// Random rounds of one kind. `make(rng, start, end, i)` builds a row; `key` is the span query's
// order (empty for none); `same` compares two rows field by field.
template <typename Row, typename Make, typename Key, typename Same>
void random_rounds(unsigned seed, bool by_time, bool ordered, Make make, Key key, Same same) {
  SCOPED_TRACE("seed " + std::to_string(seed) + (by_time ? ", by time" : ", by write sequence"));
  std::mt19937_64 rng(seed);
  HeldRows<Row> held;
  std::vector<Row> plain;
  uint64_t now = 100 * kSecond;  // data time: where the newest rows end
  int serial = 0;
  for (int round = 0; round < 60; ++round) {
    const uint64_t from_ns = now > 60 * kSecond ? now - 60 * kSecond : 0;  // the span: the last minute
    const uint64_t cut_ns = by_time ? now - std::uniform_int_distribution<uint64_t>(0, 20)(rng) * kSecond : UINT64_MAX;
    const uint64_t floor = by_time ? cut_ns : from_ns;  // every new row ends after it
    std::vector<Row> fresh;
    const int n = std::uniform_int_distribution<int>(0, 200)(rng);
    for (int i = 0; i < n; ++i) {
      const int shape = std::uniform_int_distribution<int>(0, 99)(rng);
      uint64_t start, end;
      if (shape < 80) {  // the new window's rows
        start = now + std::uniform_int_distribution<uint64_t>(0, 10 * kSecond)(rng);
        end = start + std::uniform_int_distribution<uint64_t>(0, kSecond)(rng);
      } else if (shape < 90) {  // a late row: ended within the span, after the floor
        end = floor + 1 + std::uniform_int_distribution<uint64_t>(0, now + 10 * kSecond - floor)(rng);
        start = end - std::min<uint64_t>(end, std::uniform_int_distribution<uint64_t>(0, kSecond)(rng));
      } else if (shape < 97) {  // began long before the span, ends in it
        end = std::max(floor + 1, now) + std::uniform_int_distribution<uint64_t>(0, 10 * kSecond)(rng);
        start = end - std::min<uint64_t>(end, std::uniform_int_distribution<uint64_t>(30, 200)(rng) * kSecond);
      } else {  // ends before it begins (a clock step)
        end = std::max(floor + 1, now) + std::uniform_int_distribution<uint64_t>(0, 10 * kSecond)(rng);
        start = end + std::uniform_int_distribution<uint64_t>(1, 5 * kSecond)(rng);
      }
      Row r = make(rng, start, end, serial++);
      if (row_end(r) <= floor) continue;  // (a kind whose end is computed: as the store's query)
      fresh.push_back(std::move(r));
    }
    if (ordered) std::stable_sort(fresh.begin(), fresh.end(), [&](const Row& a, const Row& b) { return key(a) < key(b); });
    plain_merge(plain, fresh, from_ns, cut_ns, key, ordered);
    detail::merge_rows(held, fresh, from_ns, cut_ns);
    ASSERT_TRUE(fresh.empty()) << "the read's vector is left empty for the next read";
    ASSERT_EQ(held.size(), plain.size()) << "round " << round;
    for (size_t i = 0; i < plain.size(); ++i) ASSERT_TRUE(same(held[i], plain[i])) << "round " << round << ", row " << i;
    now += std::uniform_int_distribution<uint64_t>(0, 15)(rng) * kSecond;
  }
}

TEST(HeldRows, StepsAfterManyRoundsAreWhatThePlainMergeHolds) {
  auto make = [](std::mt19937_64& rng, uint64_t start, uint64_t end, int i) {
    store::StepRecord s;
    s.start_ns = start;
    s.end_ns = end;
    s.pid = static_cast<uint32_t>(std::uniform_int_distribution<int>(1, 3)(rng));  // equal keys happen
    s.node = "node-" + std::to_string(std::uniform_int_distribution<int>(0, 1)(rng));
    if (std::uniform_int_distribution<int>(0, 9)(rng) == 0) s.start_ns = (start / kSecond) * kSecond;
    s.step = static_cast<uint64_t>(i);
    return s;
  };
  auto key = [](const store::StepRecord& r) { return std::tie(r.start_ns, r.node, r.pid); };
  auto same = [](const store::StepRecord& a, const store::StepRecord& b) {
    return std::tie(a.start_ns, a.end_ns, a.node, a.pid, a.step) == std::tie(b.start_ns, b.end_ns, b.node, b.pid, b.step);
  };
  for (unsigned seed = 1; seed <= 20; ++seed) {
    random_rounds<store::StepRecord>(seed, false, true, make, key, same);
    random_rounds<store::StepRecord>(seed, true, true, make, key, same);
  }
}

TEST(HeldRows, CollectivesWithoutAnExitAfterManyRoundsAreWhatThePlainMergeHolds) {
  auto make = [](std::mt19937_64& rng, uint64_t start, uint64_t end, int i) {
    store::CollectiveRecord c;
    c.enter_ns = start;
    c.exit_ns = std::uniform_int_distribution<int>(0, 9)(rng) == 0 ? 0 : end;  // a call still in progress
    c.pid = static_cast<uint32_t>(std::uniform_int_distribution<int>(1, 3)(rng));
    c.node = "node-0";
    c.seq = static_cast<uint64_t>(i);
    c.op = "allreduce";
    return c;
  };
  auto key = [](const store::CollectiveRecord& r) { return std::tie(r.enter_ns, r.node, r.pid); };
  auto same = [](const store::CollectiveRecord& a, const store::CollectiveRecord& b) {
    return std::tie(a.enter_ns, a.exit_ns, a.node, a.pid, a.seq, a.op) ==
           std::tie(b.enter_ns, b.exit_ns, b.node, b.pid, b.seq, b.op);
  };
  for (unsigned seed = 1; seed <= 20; ++seed) {
    random_rounds<store::CollectiveRecord>(seed, false, true, make, key, same);
    random_rounds<store::CollectiveRecord>(seed, true, true, make, key, same);
  }
}

TEST(HeldRows, DeviceActivityInNoOrderAfterManyRoundsIsWhatThePlainAppendHolds) {
  auto make = [](std::mt19937_64&, uint64_t start, uint64_t end, int i) {
    store::DeviceActivity d;
    d.start_ns = start;
    d.end_ns = end;
    d.pid = 1;
    d.kind = "kernel";
    // Long names live on the heap: a dropped row's memory is given back, a moved one's kept.
    d.name = "a_kernel_name_longer_than_the_small_string_buffer_" + std::to_string(i);
    d.node = "node-0";
    return d;
  };
  auto key = [](const store::DeviceActivity& r) { return std::tie(r.start_ns); };
  auto same = [](const store::DeviceActivity& a, const store::DeviceActivity& b) {
    return std::tie(a.start_ns, a.end_ns, a.name) == std::tie(b.start_ns, b.end_ns, b.name);
  };
  for (unsigned seed = 1; seed <= 20; ++seed) {
    random_rounds<store::DeviceActivity>(seed, false, false, make, key, same);
    random_rounds<store::DeviceActivity>(seed, true, false, make, key, same);
  }
}

}  // namespace
}  // namespace strata::diagnose
