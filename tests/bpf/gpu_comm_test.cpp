// The GPU and communication layers against the testbed (CUDA/NCCL stand-ins with the real ABI) and
// the real CUDA 13 / NCCL 2.28 libraries of the machine image. Needs root + BPF.
#include <gtest/gtest.h>

#include <algorithm>
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
    if (kernel.empty() || kernel[0] != '[') {  // [memcpy], [cudaMalloc], ...: no kernel
      EXPECT_TRUE(names.count(kernel)) << kernel;
    }
    ++rows;
    if (std::stoi(line.substr(bar + 1)) > 0) ++with_stack;
  }
  EXPECT_GT(rows, 0u) << "no sampled launches";
  EXPECT_EQ(with_stack, rows) << "every sampled launch has its CPU stack";
}

// What each rank of a run did, by name (truth.json per_rank[].calls): API calls, kernel:NAME for
// driver-launched kernels, bytes:API for the bytes of the memory calls.
std::map<uint32_t, std::map<std::string, long>> read_calls(const std::string& path) {
  auto r = run("python3 -c 'import json,sys; t=json.load(open(sys.argv[1]))\n"
               "for p in t[\"per_rank\"]:\n"
               "  for k, v in p[\"calls\"].items(): print(p[\"pid\"], k, v)' " +
               path);
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  std::map<uint32_t, std::map<std::string, long>> out;
  std::istringstream in(r.out);
  uint32_t pid;
  std::string name;
  long n;
  while (in >> pid >> name >> n) out[pid][name] = n;
  return out;
}

// Sums of one metric over the recording's windows, by (pid, label).
std::map<std::pair<uint32_t, std::string>, double> metric_sums(store::Store& st, const std::string& name) {
  std::map<std::pair<uint32_t, std::string>, double> out;
  auto rows = st.metrics(name);
  EXPECT_TRUE(rows) << (rows ? "" : rows.error().message);
  if (!rows) return out;
  for (const auto& row : *rows) {
    if (row.metric.name == name) out[{row.metric.pid, row.metric.label}] += row.metric.value;
  }
  return out;
}

double value(const std::map<std::pair<uint32_t, std::string>, double>& m, uint32_t pid, const std::string& label) {
  auto it = m.find({pid, label});
  return it == m.end() ? 0.0 : it->second;
}

// Issue 18 item 3: kernels launched through the driver API (cuLaunchKernel / cuLaunchKernelEx of a
// loaded module, as Triton launches them) are counted by name, and the memory calls (cudaMalloc,
// cudaFree, synchronous cudaMemcpy, cuMemAlloc_v2, cuMemFree_v2) are counted, sized and timed.
TEST(GpuComm, DriverApiLaunchesAndMemoryCalls) {
  TempDir d;
  const int ranks = 2, steps = 20;
  auto rec = run(strata_bin() + " record -o " + d.file("drv.db") + " -- " + sim() + " run --ranks " +
                 std::to_string(ranks) + " --steps " + std::to_string(steps) + " --driver-api --memory-calls --quiet --truth " +
                 d.file("truth.json"));
  ASSERT_EQ(rec.exit_code, 0) << describe(rec);
  auto truth = read_calls(d.file("truth.json"));
  ASSERT_EQ(static_cast<int>(truth.size()), ranks) << "every rank reported its calls";
  auto st = open_ro(d.file("drv.db"));
  ASSERT_TRUE(st);

  const std::vector<std::string> driver_kernels = {"triton_poi_fused_relu_0", "triton_red_fused_native_layer_norm_1"};
  const std::vector<std::string> memory_calls = {"cudaMalloc", "cudaFree", "cudaMemcpy", "cuMemAlloc_v2", "cuMemFree_v2"};
  auto kernel_count = metric_sums(*st, "gpu.kernel_count");
  auto calls = metric_sums(*st, "api.calls");
  auto time_us = metric_sums(*st, "api.time_us");
  auto bytes = metric_sums(*st, "api.bytes");
  long memory_done = 0, lookups = 0;
  for (const auto& [pid, done] : truth) {
    // The device timeline has every driver-launched kernel, named by its CUfunction.
    for (const auto& k : driver_kernels) {
      ASSERT_TRUE(done.count("kernel:" + k)) << "the sim launched " << k;
      EXPECT_GT(done.at("kernel:" + k), static_cast<long>(steps)) << k;
      EXPECT_EQ(value(kernel_count, pid, k), static_cast<double>(done.at("kernel:" + k))) << "pid " << pid << " " << k;
    }
    // The memory calls: every one counted (their probes are always on at this rate), with its time
    // and bytes.
    for (const auto& c : memory_calls) {
      ASSERT_TRUE(done.count(c)) << "the sim made " << c;
      memory_done += done.at(c);
      EXPECT_EQ(value(calls, pid, c), static_cast<double>(done.at(c))) << "pid " << pid << " " << c;
      EXPECT_GT(value(time_us, pid, c), 0.0) << "pid " << pid << " " << c;
    }
    for (const auto& c : {"cudaMalloc", "cudaMemcpy", "cuMemAlloc_v2"}) {
      EXPECT_EQ(value(bytes, pid, c), static_cast<double>(done.at(std::string("bytes:") + c))) << "pid " << pid << " " << c;
    }
    // A synchronous copy blocks for at least its modeled transfer (bytes / PCIe bandwidth, the
    // stand-in's sleep): a floor that a loaded machine can only raise.
    double floor_us = static_cast<double>(done.at("bytes:cudaMemcpy")) / 25000.0;  // STRATA_COST_PCIE_BYTES_PER_US
    EXPECT_GE(value(time_us, pid, "cudaMemcpy"), floor_us) << "pid " << pid;
    for (const char* c : {"cuModuleGetFunction", "cuLibraryGetKernel", "cuKernelGetFunction"}) {
      EXPECT_EQ(value(calls, pid, c), static_cast<double>(done.at(c))) << "pid " << pid << " " << c;
      lookups += done.at(c);  // each gives a new handle its name
    }
    EXPECT_EQ(value(calls, pid, "cuFuncGetName"), static_cast<double>(done.at("cuFuncGetName")));
  }

  // Sampled driver launches carry their kernel's name (from cuModuleGetFunction's return) and
  // their CPU stack; none is left named by its handle.
  auto r = run("sqlite3 " + d.file("drv.db") +
               " \"SELECT l.kernel, length(s.frames), l.count FROM launch_samples l JOIN stacks s ON s.id=l.stack_id\"");
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  std::istringstream in(r.out);
  std::string line;
  long driver_samples = 0;
  while (std::getline(in, line)) {
    auto bar2 = line.rfind('|');
    auto bar1 = line.rfind('|', bar2 - 1);
    std::string kernel = line.substr(0, bar1);
    EXPECT_EQ(kernel.find("CUfunction@"), std::string::npos) << "an unnamed driver launch: " << kernel;
    if (std::find(driver_kernels.begin(), driver_kernels.end(), kernel) == driver_kernels.end()) continue;
    EXPECT_GT(std::stoi(line.substr(bar1 + 1, bar2 - bar1 - 1)), 0) << "a driver launch without its stack";
    driver_samples += std::stol(line.substr(bar2 + 1));
  }
  EXPECT_GT(driver_samples, 0) << "no sampled driver launch";

  // The agent's own account: every sampled driver launch is a probe hit it paid for, and every
  // memory call one more.
  auto recording = st->latest_recording();
  ASSERT_TRUE(recording && *recording);
  auto stats = st->stats(**recording);
  ASSERT_TRUE(stats);
  std::map<std::string, double> stat(stats->begin(), stats->end());
  EXPECT_EQ(stat["gpu_comm.driver_launch_hits"], static_cast<double>(driver_samples));
  EXPECT_EQ(stat["gpu_comm.driver_functions_named"], static_cast<double>(lookups))
      << "every handle named by its lookup (module, library kernel, kernel's function)";
  EXPECT_EQ(stat["gpu_comm.memory_probes_sampled"], 0.0);
  EXPECT_EQ(stat["gpu_comm.memory_hits"], static_cast<double>(memory_done));
  EXPECT_GT(stat["gpu_comm.memory_probe_cost_s"], 0.0);
}

// A storm of memory calls (~10k a second) passes the memory budget: the agent stops probing every
// call and samples them in bursts of their own, so most calls go unprobed, the stats say so, and
// each window says what share of it the probes covered (api.memory_coverage, under 1).
TEST(GpuComm, MemoryCallStormIsSampledNotProbedAlways) {
  TempDir d;
  auto rec = run(strata_bin() + " record -o " + d.file("m.db") + " -- " + testprog("memory_storm") + " " +
                 testbed_lib() + " 6 " + d.file("calls"));
  ASSERT_EQ(rec.exit_code, 0) << describe(rec);
  long done = std::atol(slurp(d.file("calls")).c_str());
  ASSERT_GT(done, 2000) << "the storm made too few calls to pass the budget";
  auto st = open_ro(d.file("m.db"));
  ASSERT_TRUE(st);
  auto recording = st->latest_recording();
  ASSERT_TRUE(recording && *recording);
  auto stats = st->stats(**recording);
  ASSERT_TRUE(stats);
  std::map<std::string, double> stat(stats->begin(), stats->end());
  EXPECT_EQ(stat["gpu_comm.memory_probes_sampled"], 1.0);
  EXPECT_GT(stat["gpu_comm.memory_hits"], 0.0) << "the calls were probed at first";
  EXPECT_LT(stat["gpu_comm.memory_hits"], static_cast<double>(done) / 2) << "of " << done << " calls";
  double counted = 0;
  for (const auto& [key, v] : metric_sums(*st, "api.calls")) {
    if (key.second == "cudaMalloc" || key.second == "cudaFree") counted += v;
  }
  EXPECT_EQ(counted, stat["gpu_comm.memory_hits"]) << "every probe hit is in the windows' counts";
  auto coverage = metric_sums(*st, "api.memory_coverage");
  EXPECT_FALSE(coverage.empty()) << "sampled windows say how much of them was probed";
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
