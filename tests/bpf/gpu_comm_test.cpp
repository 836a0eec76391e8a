// The GPU and communication layers against the testbed (CUDA/NCCL stand-ins with the real ABI) and
// the real CUDA 13 / NCCL 2.28 libraries of the machine image. Needs root + BPF.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>

#include "store/store.h"
#include "tests/support/run.h"

namespace strata::test {
namespace {

std::string sim() { return env_or("STRATA_BIN", build_dir() + "/bin") + "/strata-sim"; }
std::string testbed_lib() { return build_dir() + "/testbed/lib"; }

struct TruthRank {
  uint32_t pid = 0;
  long collectives = 0;
  long steps = 0;
};

std::map<int, TruthRank> read_truth(const std::string& path) {
  auto r = run("python3 -c 'import json,sys; t=json.load(open(sys.argv[1]))\n"
               "for p in t[\"per_rank\"]: print(p[\"rank\"], p[\"pid\"], p[\"collectives\"], p[\"steps_done\"])' " +
               path);
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  std::map<int, TruthRank> out;
  std::istringstream in(r.out);
  int rank;
  TruthRank t;
  while (in >> rank >> t.pid >> t.collectives >> t.steps) out[rank] = t;
  return out;
}

std::unique_ptr<store::Store> open_ro(const std::string& path) {
  auto st = store::Store::open_sqlite(path, store::Store::Mode::kReadOnly);
  EXPECT_TRUE(st) << (st ? "" : st.error().message);
  return st ? std::move(*st) : nullptr;
}

// The stand-ins' kernel stubs, demangled: the names a kernel may have.
std::set<std::string> stub_names() {
  auto r = run("nm -DC --defined-only " + testbed_lib() + "/libtestbed_kernels.so " + testbed_lib() +
               "/libnccl.so.2 | cut -c20-");
  std::set<std::string> names;
  std::istringstream in(r.out);
  std::string line;
  while (std::getline(in, line)) names.insert(line);
  return names;
}

void check_sim_run(const std::string& extra, int ranks, int steps) {
  TempDir d;
  auto rec = run(strata_bin() + " record -o " + d.file("sim.db") + " -- " + sim() + " run --ranks " +
                 std::to_string(ranks) + " --steps " + std::to_string(steps) + " --truth " + d.file("truth.json") +
                 " " + extra);
  ASSERT_EQ(rec.exit_code, 0) << describe(rec);
  auto truth = read_truth(d.file("truth.json"));
  ASSERT_EQ(static_cast<int>(truth.size()), ranks);
  auto st = open_ro(d.file("sim.db"));
  ASSERT_TRUE(st);

  // Every collective call of every rank, with sequence numbers that match across ranks.
  auto colls = st->collectives();
  ASSERT_TRUE(colls);
  std::map<uint32_t, std::vector<store::CollectiveRecord>> by_pid;
  for (const auto& c : *colls) by_pid[c.pid].push_back(c);
  std::map<uint64_t, std::string> sig_by_seq;
  for (const auto& [rank, t] : truth) {
    const auto& calls = by_pid[t.pid];
    ASSERT_EQ(static_cast<long>(calls.size()), t.collectives) << "rank " << rank;
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(calls[i].seq, i + 1) << "rank " << rank;
      EXPECT_FALSE(calls[i].comm_id.empty()) << "rank " << rank << " seq " << calls[i].seq;
      EXPECT_EQ(calls[i].completion, "device") << "the GPU timing source gives the device end";
      std::string sig = calls[i].op + "/" + std::to_string(calls[i].bytes) + "/" + calls[i].comm_id;
      auto [it, inserted] = sig_by_seq.emplace(calls[i].seq, sig);
      EXPECT_EQ(it->second, sig) << "seq " << calls[i].seq << " differs between ranks";
    }
  }
  // Communicators: one per rank, the same id, ranks 0..N-1 of N.
  auto comms = st->communicators();
  ASSERT_TRUE(comms);
  ASSERT_EQ(static_cast<int>(comms->size()), ranks);
  std::set<int> comm_ranks;
  for (const auto& c : *comms) {
    EXPECT_EQ(c.comm_id, (*comms)[0].comm_id);
    EXPECT_EQ(c.nranks, ranks);
    comm_ranks.insert(c.rank);
  }
  EXPECT_EQ(static_cast<int>(comm_ranks.size()), ranks);

  // Steps found from the collective pattern alone.
  auto found = st->steps();
  ASSERT_TRUE(found);
  std::map<uint32_t, long> steps_by_pid;
  for (const auto& s : *found) steps_by_pid[s.pid]++;
  for (const auto& [rank, t] : truth) EXPECT_EQ(steps_by_pid[t.pid], t.steps) << "rank " << rank;

  // Kernel names are the stand-ins' stub symbols.
  auto names = stub_names();
  ASSERT_GT(names.size(), 10u);
  auto dev = st->device_activity();
  ASSERT_TRUE(dev);
  size_t kernels = 0;
  for (const auto& a : *dev) {
    if (a.kind != "kernel" && a.kind != "collective") continue;
    ++kernels;
    EXPECT_TRUE(names.count(a.name)) << "unknown kernel name: " << a.name;
  }
  EXPECT_GT(kernels, static_cast<size_t>(ranks * steps * 10));
}

TEST(GpuComm, SimCollectivesStepsAndKernels) { check_sim_run("", 4, 12); }

TEST(GpuComm, SimPythonRanks) { check_sim_run("--python", 2, 8); }

TEST(GpuComm, SampledLaunchesCarryKernelNamesAndStacks) {
  TempDir d;
  auto rec = run(strata_bin() + " record -o " + d.file("sim.db") + " -- " + sim() + " run --ranks 2 --steps 10");
  ASSERT_EQ(rec.exit_code, 0) << describe(rec);
  auto r = run("sqlite3 " + d.file("sim.db") +
               " \"SELECT l.kernel, length(s.frames) FROM launch_samples l JOIN stacks s ON s.id=l.stack_id\"");
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  auto names = stub_names();
  std::istringstream in(r.out);
  std::string line;
  size_t rows = 0, with_stack = 0;
  while (std::getline(in, line)) {
    auto bar = line.rfind('|');
    std::string kernel = line.substr(0, bar);
    if (kernel != "[memcpy]") {
      EXPECT_TRUE(names.count(kernel)) << kernel;
    }
    ++rows;
    if (std::stoi(line.substr(bar + 1)) > 0) ++with_stack;
  }
  EXPECT_GT(rows, 0u) << "no sampled launches";
  EXPECT_EQ(with_stack, rows) << "every sampled launch has its CPU stack";
}

TEST(GpuComm, ChromeTraceIsValidWithAProcessPerRank) {
  TempDir d;
  auto rec = run(strata_bin() + " record -o " + d.file("sim.db") + " -- " + sim() + " run --ranks 3 --steps 6");
  ASSERT_EQ(rec.exit_code, 0) << describe(rec);
  auto rep = run(strata_bin() + " report " + d.file("sim.db") + " --format chrome-trace -o " + d.file("t.json"));
  ASSERT_EQ(rep.exit_code, 0) << describe(rep);
  auto check = run("python3 " + source_dir() + "/tests/support/check_trace.py " + d.file("t.json") +
                   " 3");
  EXPECT_EQ(check.exit_code, 0) << describe(check);
}

TEST(GpuComm, RealLibrariesAreObserved) {
  TempDir d;
  auto rec = run(strata_bin() + " record -o " + d.file("r.db") + " -- " + testprog("real_cuda_calls"));
  ASSERT_EQ(rec.exit_code, 0) << describe(rec);
  auto st = open_ro(d.file("r.db"));
  ASSERT_TRUE(st);
  auto m = st->metrics("api.calls");
  ASSERT_TRUE(m);
  std::set<std::string> seen;
  for (const auto& row : *m) seen.insert(row.metric.label);
  EXPECT_TRUE(seen.count("ncclGetVersion")) << "the real libnccl.so.2 was not probed";
  EXPECT_TRUE(seen.count("cudaGetDeviceCount")) << "the real libcudart.so.13 was not probed";
}

TEST(GpuComm, LateDlopenTwoCommunicatorsZeroBytesAndAPeerThatDies) {
  TempDir d;
  auto rec = run(strata_bin() + " record -o " + d.file("e.db") + " -- " + testprog("nccl_edge") + " " + testbed_lib());
  ASSERT_EQ(rec.exit_code, 0) << describe(rec);
  auto st = open_ro(d.file("e.db"));
  ASSERT_TRUE(st);
  auto comms = st->communicators();
  ASSERT_TRUE(comms);
  std::map<uint32_t, std::set<std::string>> ids;
  for (const auto& c : *comms) ids[c.pid].insert(c.comm_id);
  ASSERT_EQ(ids.size(), 2u) << "both ranks' communicators";
  for (const auto& [pid, s] : ids) EXPECT_EQ(s.size(), 2u) << "two communicators in pid " << pid;
  auto colls = st->collectives();
  ASSERT_TRUE(colls);
  std::map<uint32_t, int> zero, normal;
  for (const auto& c : *colls) (c.bytes == 0 ? zero : normal)[c.pid]++;
  ASSERT_EQ(zero.size(), 2u);
  for (const auto& [pid, n] : zero) EXPECT_EQ(n, 5) << "0-byte all-reduces of " << pid;
  // Rank 1 left after 5; rank 0 entered a 6th that could not complete: recorded all the same.
  std::vector<int> counts;
  for (const auto& [pid, n] : normal) counts.push_back(n);
  std::sort(counts.begin(), counts.end());
  EXPECT_EQ(counts, (std::vector<int>{5, 6}));
}

TEST(GpuComm, SplitAndInitAllMembership) {
  TempDir d;
  auto rec = run(strata_bin() + " record -o " + d.file("s.db") + " -- " + testprog("nccl_split") + " " + testbed_lib());
  ASSERT_EQ(rec.exit_code, 0) << describe(rec);
  auto st = open_ro(d.file("s.db"));
  ASSERT_TRUE(st);
  auto comms = st->communicators();
  ASSERT_TRUE(comms);
  // Per pid: the world (its rank of 4), its half (position unknown: -1), rank 0's InitAll pair.
  std::map<uint32_t, std::vector<store::CommunicatorRecord>> by_pid;
  for (const auto& c : *comms) by_pid[c.pid].push_back(c);
  ASSERT_EQ(by_pid.size(), 4u) << "four ranks' communicators";
  std::map<int, uint32_t> pid_of_rank;
  std::map<int, std::string> half_of_rank;
  std::string world;
  std::vector<store::CommunicatorRecord> init_all;
  for (const auto& [pid, cs] : by_pid) {
    int rank = -1;
    for (const auto& c : cs) {
      if (c.nranks == 4) {
        rank = c.rank;
        if (world.empty()) world = c.comm_id;
        EXPECT_EQ(c.comm_id, world);
      }
    }
    ASSERT_GE(rank, 0) << "pid " << pid << " has its world communicator";
    pid_of_rank[rank] = pid;
    for (const auto& c : cs) {
      if (c.rank == -1) half_of_rank[rank] = c.comm_id;
      if (c.nranks == 2) init_all.push_back(c);
    }
  }
  ASSERT_EQ(half_of_rank.size(), 4u) << "every rank's ncclCommSplit communicator";
  EXPECT_EQ(half_of_rank[0], half_of_rank[2]);
  EXPECT_EQ(half_of_rank[1], half_of_rank[3]);
  EXPECT_NE(half_of_rank[0], half_of_rank[1]);
  EXPECT_NE(half_of_rank[0], world);
  ASSERT_EQ(init_all.size(), 2u) << "ncclCommInitAll's two handles";
  EXPECT_EQ(init_all[0].pid, pid_of_rank[0]);
  EXPECT_EQ(init_all[0].comm_id, init_all[1].comm_id);
  EXPECT_EQ(init_all[0].rank + init_all[1].rank, 1) << "positions 0 and 1";
  // The all-reduces on the halves carry the split communicator's id.
  auto colls = st->collectives();
  ASSERT_TRUE(colls);
  std::map<uint32_t, int> on_half;
  for (const auto& c : *colls) {
    for (const auto& [rank, pid] : pid_of_rank) {
      if (c.pid == pid && c.comm_id == half_of_rank[rank]) on_half[pid]++;
    }
  }
  for (const auto& [rank, pid] : pid_of_rank) EXPECT_EQ(on_half[pid], 3) << "rank " << rank;
}

}  // namespace
}  // namespace strata::test
