// The CLI's contract for bad input: a one-line reason, exit 1, nothing written or damaged.
#include <gtest/gtest.h>

#include "tests/support/run.h"

namespace strata::test {
namespace {

void expect_one_line_error(const RunResult& r, int code, const std::string& needle) {
  EXPECT_EQ(r.exit_code, code) << describe(r);
  EXPECT_NE(r.err.find(needle), std::string::npos) << describe(r);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "expected one line:\n" << r.err;
}

TEST(Cli, RecordOfAMissingPidExitsOne) {
  TempDir d;
  auto r = run(strata_bin() + " record -o " + d.file("x.db") + " -p 3999999");
  expect_one_line_error(r, 1, "no such process: 3999999");
  EXPECT_TRUE(slurp(d.file("x.db")).empty()) << "no store is created on bad input";
}

TEST(Cli, RecordOfAMissingCommandExitsOne) {
  TempDir d;
  auto r = run(strata_bin() + " record -o " + d.file("x.db") + " -- /nonexistent/cmd --flag");
  expect_one_line_error(r, 1, "command not found");
  r = run(strata_bin() + " record -o " + d.file("x.db") + " -- no-such-command-strata");
  expect_one_line_error(r, 1, "no-such-command-strata");
}

TEST(Cli, CorruptOrForeignStoreExitsOneAndIsLeftUntouched) {
  TempDir d;
  run("head -c 4096 /dev/urandom > " + d.file("junk.db") + "; printf 'SQLite format 3\\0garbage' > " +
      d.file("trunc.db") + "; sqlite3 " + d.file("other.db") + " 'CREATE TABLE t(x); INSERT INTO t VALUES(1)'");
  for (const char* name : {"junk.db", "trunc.db", "other.db"}) {
    std::string path = d.file(name);
    std::string before = slurp(path);
    ASSERT_FALSE(before.empty()) << name;
    auto rep = run(strata_bin() + " report " + path);
    expect_one_line_error(rep, 1, "not a strata store");
    auto rec = run(strata_bin() + " record -o " + path + " -- /bin/true");
    expect_one_line_error(rec, 1, "not a strata store");
    EXPECT_EQ(slurp(path), before) << name << " was modified";
  }
}

TEST(Cli, UsageErrorsExitOne) {
  expect_one_line_error(run(strata_bin() + " record"), 1, "either -p");
  expect_one_line_error(run(strata_bin() + " record -F 100000 -- /bin/true"), 1, "out of range");
  expect_one_line_error(run(strata_bin() + " record -p abc"), 1, "not a number");
  expect_one_line_error(run(strata_bin() + " record --duration -3 -p 1"), 1, "positive number");
  expect_one_line_error(run(strata_bin() + " frobnicate"), 1, "unknown command");
  expect_one_line_error(run(strata_bin() + " report"), 1, "which store");
  expect_one_line_error(run(strata_bin() + " report /nonexistent.db"), 1, "no such file");
  expect_one_line_error(run(strata_bin() + " record --unwind-tables-mb 0.01 -- /bin/true"), 1, "size in MiB");
  expect_one_line_error(run(strata_bin() + " record --unwind-tables-mb 1x -- /bin/true"), 1, "size in MiB");
  expect_one_line_error(run(strata_bin() + " agent -o x.db --spool-max-mb -1"), 1, "size in MiB");
  expect_one_line_error(run(strata_bin() + " agent -o x.db --unwind-tables-mb nan"), 1, "size in MiB");
}

TEST(Cli, HelpAnswers) {
  for (const char* cmd : {" --help", " record --help", " report --help"}) {
    auto r = run(strata_bin() + cmd);
    EXPECT_EQ(r.exit_code, 0) << cmd;
    EXPECT_NE(r.out.find("usage: strata"), std::string::npos) << cmd;
  }
}

}  // namespace
}  // namespace strata::test
