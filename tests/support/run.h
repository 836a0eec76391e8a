// Test support: run a command through /bin/sh, capture exit code, stdout and stderr; locate the
// build's programs from the environment CTest sets (STRATA_BIN, STRATA_TESTPROGS, ...).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace strata::test {

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

// The build folder: from CTest's environment, else the one this test binary sits in (build/tests/x),
// so a test binary also runs by hand.
inline std::string build_dir() {
  if (const char* b = std::getenv("STRATA_BUILD"); b && *b) return b;
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return "build";
  std::string p(exe, static_cast<size_t>(n));
  p = p.substr(0, p.rfind('/'));  // build/tests
  return p.substr(0, p.rfind('/'));
}

inline std::string source_dir() {
#ifdef STRATA_SOURCE_DIR
  return env_or("STRATA_SOURCE", STRATA_SOURCE_DIR);
#else
  return env_or("STRATA_SOURCE", ".");
#endif
}

inline std::string strata_bin() { return env_or("STRATA_BIN", build_dir() + "/bin") + "/strata"; }
inline std::string testprog(const std::string& name) {
  return env_or("STRATA_TESTPROGS", build_dir() + "/testprogs") + "/" + name;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A fresh directory for one test, removed by the destructor.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/strata-test-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline RunResult run(const std::string& cmd) {
  TempDir d;
  std::string full = "(" + cmd + ") >'" + d.file("out") + "' 2>'" + d.file("err") + "' </dev/null";
  int status = std::system(full.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(d.file("out"));
  r.err = slurp(d.file("err"));
  return r;
}

inline std::string describe(const RunResult& r) {
  return "exit " + std::to_string(r.exit_code) + "\nstdout:\n" + r.out.substr(0, 4000) + "\nstderr:\n" +
         r.err.substr(0, 4000);
}

}  // namespace strata::test
