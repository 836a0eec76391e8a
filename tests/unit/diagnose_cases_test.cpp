// Diagnosis cases as data: each tests/data/diagnose/NAME.db is a small recorded store (strata record
// of the testbed with a fault), NAME.expected.json the findings it must produce:
//   {"findings": [{"rank": 2, "cause": "gpu-slow", "culprit": "GPU 2"}]}   ("culprit": a substring;
//                                                                          rank -1: the whole job)
//   {"findings": []}                                                       (healthy)
//   "culprit": "" checks rank and cause only (the case says why). A straggler no layer explains is
//   no finding (Diagnosis::unexplained) and never passes: no case expects one.
// Only the top finding of each expected entry's rank is checked, in order.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "diagnose/engine.h"
#include "diagnose/loader.h"
#include "diagnose/render.h"
#include "store/store.h"

namespace strata::diagnose {
namespace {

namespace fs = std::filesystem;

struct Expected {
  int rank = -1;
  std::string cause, culprit;
};

fs::path cases_dir() {
  const char* src = std::getenv("STRATA_SOURCE");
  return fs::path(src ? src : ".") / "tests" / "data" / "diagnose";
}

std::vector<std::string> case_names() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(cases_dir(), ec)) {
    if (e.path().extension() == ".db") out.push_back(e.path().stem().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The expected files are tiny and flat: one object per finding, three keys each.
std::vector<Expected> read_expected(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  std::vector<Expected> out;
  std::regex obj(R"(\{[^{}]*\})");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), obj); it != std::sregex_iterator(); ++it) {
    std::string o = it->str();
    std::smatch m;
    Expected e;
    if (std::regex_search(o, m, std::regex(R"re("rank"\s*:\s*(-?\d+))re"))) e.rank = std::stoi(m[1]);
    if (std::regex_search(o, m, std::regex(R"re("cause"\s*:\s*"([^"]*)")re"))) e.cause = m[1];
    if (std::regex_search(o, m, std::regex(R"re("culprit"\s*:\s*"([^"]*)")re"))) e.culprit = m[1];
    if (!e.cause.empty()) out.push_back(e);
  }
  return out;
}

class RecordedCase : public ::testing::TestWithParam<std::string> {};

TEST_P(RecordedCase, GivesTheExpectedFindings) {
  fs::path db = cases_dir() / (GetParam() + ".db");
  fs::path expected = cases_dir() / (GetParam() + ".expected.json");
  ASSERT_TRUE(fs::exists(expected)) << expected;
  // A private copy: opening a store may leave WAL/shm files, and the source tree stays clean.
  fs::path tmp = fs::temp_directory_path() / ("strata-diagnose-case-" + std::to_string(::getpid()) + ".db");
  fs::copy_file(db, tmp, fs::copy_options::overwrite_existing);
  auto st = store::Store::open_sqlite(tmp.string(), store::Store::Mode::kReadOnly);
  ASSERT_TRUE(st.ok()) << st.error().message;
  auto job = load_job_window(**st);
  ASSERT_TRUE(job.ok()) << job.error().message;
  auto dx = diagnose(*job);
  std::ostringstream text;
  write_text(dx, text);
  auto want = read_expected(expected);
  ASSERT_EQ(dx.findings.size(), want.size()) << text.str();
  EXPECT_TRUE(dx.unexplained.empty()) << text.str();
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(dx.findings[i].rank, want[i].rank) << text.str();
    // Rank -1 is a job-scope finding and only that (DESIGN §8).
    EXPECT_EQ(dx.findings[i].scope == Scope::kJob, want[i].rank == -1) << text.str();
    EXPECT_EQ(std::string(cause_name(dx.findings[i].cause)), want[i].cause) << text.str();
    // An empty expected culprit checks the cause alone.
    EXPECT_NE(dx.findings[i].culprit.find(want[i].culprit), std::string::npos)
        << "culprit '" << dx.findings[i].culprit << "' should name '" << want[i].culprit << "'\n" << text.str();
  }
  st->reset();
  fs::remove(tmp);
  fs::remove(tmp.string() + "-wal");
  fs::remove(tmp.string() + "-shm");
}

INSTANTIATE_TEST_SUITE_P(Recorded, RecordedCase, ::testing::ValuesIn(case_names()),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& ch : n) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(RecordedCase);

// The cases are found (CTest sets STRATA_SOURCE): no cases must fail, not pass by running nothing.
// A rank whose steps the loader re-cut is said with the diagnosis (its per-step figures are the
// loader's), in text and JSON; a case with steps cut alike says nothing.
TEST(RecordedCases, ARankReCutByTheLoaderIsSaid) {
  auto load = [](const std::string& name) {
    fs::path tmp = fs::temp_directory_path() / ("strata-diagnose-recut-" + std::to_string(::getpid()) + ".db");
    fs::copy_file(cases_dir() / (name + ".db"), tmp, fs::copy_options::overwrite_existing);
    Diagnosis dx;
    {
      auto st = store::Store::open_sqlite(tmp.string(), store::Store::Mode::kReadOnly);
      EXPECT_TRUE(st.ok()) << st.error().message;
      if (st.ok()) {
        auto job = load_job_window(**st);
        EXPECT_TRUE(job.ok()) << job.error().message;
        if (job.ok()) dx = diagnose(*job);
      }
    }
    fs::remove(tmp);
    fs::remove(tmp.string() + "-wal");
    fs::remove(tmp.string() + "-shm");
    return dx;
  };
  auto cut = load("ddp-hotspot-steps-cut-apart");
  ASSERT_EQ(cut.data_notes.size(), 1u);
  EXPECT_EQ(cut.data_notes[0].rfind("rank 0", 0), 0u) << cut.data_notes[0];
  EXPECT_NE(cut.data_notes[0].find("re-cut"), std::string::npos) << cut.data_notes[0];
  std::ostringstream text, json;
  write_text(cut, text);
  write_json(cut, json);
  EXPECT_NE(text.str().find("data: rank 0"), std::string::npos) << text.str();
  EXPECT_NE(json.str().find("\"data_notes\":[\"rank 0"), std::string::npos) << json.str();
  EXPECT_TRUE(load("healthy").data_notes.empty());
}

// The loader keeps each rank's interrupt time by source (the agent's os.softirq_time_us and
// os.irq_time_us labels), as its sum per step: a real run's NET_RX softirq is there by name.
TEST(RecordedCases, InterruptTimeIsKeptBySource) {
  fs::path tmp = fs::temp_directory_path() / ("strata-diagnose-irq-" + std::to_string(::getpid()) + ".db");
  fs::copy_file(cases_dir() / "healthy.db", tmp, fs::copy_options::overwrite_existing);
  {
    auto st = store::Store::open_sqlite(tmp.string(), store::Store::Mode::kReadOnly);
    ASSERT_TRUE(st.ok()) << st.error().message;
    auto job = load_job_window(**st);
    ASSERT_TRUE(job.ok()) << job.error().message;
    bool net_rx = false;
    for (const auto& r : job->ranks) {
      if (!known(r.get(Os::kIrq))) continue;
      double sum = 0;
      for (const auto& v : r.irq_sources) {
        sum += v.ms_per_step;
        net_rx = net_rx || (job->names.name(v.name) == "NET_RX softirq" && v.ms_per_step > 0);
      }
      EXPECT_NEAR(sum, r.get(Os::kIrq), 1e-6 + 1e-9 * r.get(Os::kIrq)) << "rank " << r.rank;
    }
    EXPECT_TRUE(net_rx) << "no rank's interrupt time names NET_RX softirq";
  }
  fs::remove(tmp);
  fs::remove(tmp.string() + "-wal");
  fs::remove(tmp.string() + "-shm");
}

TEST(RecordedCases, AreFound) { EXPECT_GE(case_names().size(), 10u) << "no cases in " << cases_dir() << " (STRATA_SOURCE?)"; }

// Every cause the engine can name has a recorded case whose expected findings name it, except the
// causes the testbed cannot produce yet (no fault kind makes them on a real run: they are tested on
// synthetic jobs in diagnose_engine_test). A new cause fails here until it has a case or is listed.
TEST(RecordedCases, CoverEveryCause) {
  const std::set<std::string> no_testbed_fault = {};
  std::set<std::string> covered;
  for (const auto& name : case_names()) {
    for (const auto& e : read_expected(cases_dir() / (name + ".expected.json"))) covered.insert(e.cause);
  }
  for (size_t i = 0; i < kCauseCount; ++i) {
    std::string c = cause_name(static_cast<Cause>(i));
    if (no_testbed_fault.count(c)) {
      EXPECT_FALSE(covered.count(c)) << c << " has a recorded case now: take it off the no_testbed_fault list";
    } else {
      EXPECT_TRUE(covered.count(c)) << "no recorded case in " << cases_dir() << " names cause " << c;
    }
  }
}

TEST(RecordedCases, ForeignFileIsRefused) {
  fs::path tmp = fs::temp_directory_path() / ("strata-diagnose-foreign-" + std::to_string(::getpid()) + ".db");
  {
    std::ofstream f(tmp);
    f << "not a store";
  }
  auto st = store::Store::open_sqlite(tmp.string(), store::Store::Mode::kReadOnly);
  EXPECT_FALSE(st.ok());
  fs::remove(tmp);
}

}  // namespace
}  // namespace strata::diagnose
