// The agent's /metrics follows Prometheus conventions for the layers' stats (agent/daemon/
// source_metrics.cpp), and `strata record`'s summary prints its cost with two decimals. The page of
// a running agent is checked end to end in tests/bpf/agent_metrics_test.py.
#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "agent/cost_budget.h"
#include "agent/daemon/daemon.h"
#include "agent/daemon/source_metrics.h"
#include "agent/recorder.h"

namespace strata::agent {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

TEST(AgentMetrics, EveryDescribedStatIsAWellNamedFamily) {
  const std::regex valid("[a-zA-Z_:][a-zA-Z0-9_:]*");
  std::set<std::string> keys, names;
  for (const auto& m : daemon::source_metrics()) {
    EXPECT_TRUE(keys.insert(m.key).second) << "listed twice: " << m.key;
    std::string name = m.name;
    if (name.empty()) continue;  // on the page under another name
    EXPECT_TRUE(names.insert(name).second) << "two stats in one family: " << name;
    EXPECT_TRUE(std::regex_match(name, valid)) << name;
    EXPECT_EQ(name.rfind("strata_agent_", 0), 0u) << name;
    std::string type = m.type;
    ASSERT_TRUE(type == "counter" || type == "gauge") << name << ": " << type;
    EXPECT_EQ(ends_with(name, "_total"), type == "counter") << name << " is a " << type;
    EXPECT_FALSE(std::string(m.help).empty()) << name;
    // A stat in seconds, milliseconds or microseconds has "seconds" in its family's name.
    std::string key = m.key;
    bool timed = ends_with(key, "_s") || ends_with(key, "_ms_mean") || ends_with(key, "_us");
    EXPECT_EQ(timed, name.find("_seconds") != std::string::npos) << key << " -> " << name;
  }
}

TEST(AgentMetrics, StatsGetHelpTypeAndTheirUnit) {
  std::ostringstream o;
  daemon::write_source_metrics(o, {{"gpu_comm.probe_entries", 12},
                                   {"nvml.poll_ms_mean", 2.5},
                                   {"offcpu_stored_us", 3'000'000},
                                   {"gpu_comm.gpu_processes", 4},
                                   {"newlayer.some-stat", 7}});
  std::string page = o.str();
  EXPECT_NE(page.find("# HELP strata_agent_gpu_comm_probe_entries_total "), std::string::npos) << page;
  EXPECT_NE(page.find("# TYPE strata_agent_gpu_comm_probe_entries_total counter\n"
                      "strata_agent_gpu_comm_probe_entries_total 12\n"),
            std::string::npos)
      << page;
  EXPECT_NE(page.find("# TYPE strata_agent_nvml_poll_mean_seconds gauge\nstrata_agent_nvml_poll_mean_seconds 0.0025\n"),
            std::string::npos)
      << page;
  EXPECT_NE(page.find("strata_agent_offcpu_stored_seconds_total 3\n"), std::string::npos) << page;
  // Shown elsewhere on the page (strata_agent_gpu_processes): not twice.
  EXPECT_EQ(page.find("gpu_processes"), std::string::npos) << page;
  // A stat nobody described yet still shows, as a valid gauge that says so.
  EXPECT_NE(page.find("# TYPE strata_agent_newlayer_some_stat gauge\nstrata_agent_newlayer_some_stat 7\n"),
            std::string::npos)
      << page;
  EXPECT_NE(page.find(daemon::kUndescribedHelp), std::string::npos) << page;
  EXPECT_EQ(page.find("source_stat"), std::string::npos) << page;
}

// Which processes the agent watches by default: a launcher's ranks (RANK, WORLD_SIZE, torchrun's
// run id, STRATA_JOB), and torch.multiprocessing.spawn's, which carry only the env:// rendezvous
// (MASTER_ADDR and MASTER_PORT; their rank is an argument). Anything else is left alone.
TEST(AgentSelector, FindsLaunchedAndSpawnedRanksByDefault) {
  daemon::Selector any;
  EXPECT_TRUE(any.matches({{"RANK", "0"}}));
  EXPECT_TRUE(any.matches({{"TORCHELASTIC_RUN_ID", "x"}}));
  EXPECT_TRUE(any.matches({{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}, {"PATH", "/bin"}}));
  EXPECT_FALSE(any.matches({{"MASTER_PORT", "29500"}}));
  EXPECT_FALSE(any.matches({{"PATH", "/bin"}, {"HOME", "/root"}}));
  daemon::Selector only;
  only.terms["STRATA_JOB"] = {"a"};
  EXPECT_FALSE(only.matches({{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}})) << "--select decides alone";
}

TEST(AgentMetrics, CostIsPrintedWithTwoDecimals) {
  EXPECT_EQ(percent(0.0135022), "1.35%");
  EXPECT_EQ(percent(0.002), "0.20%");
  RecordSummary s;
  s.agent_cpu_s = 0.0135022;
  s.target_cpu_s = 1;
  s.wall_s = 1;
  std::ostringstream o;
  print_summary(s, "out.db", o);
  EXPECT_NE(o.str().find(" = 1.35% of the target's 1.00 s CPU"), std::string::npos) << o.str();
}

}  // namespace
}  // namespace strata::agent
