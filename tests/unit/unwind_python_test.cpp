// CPython layouts against live interpreters of each version present on the machine: a child
// interpreter stops inside a known chain (recursion included); its frames are walked through its
// memory with the same logic the BPF program uses, and code objects give names, files and lines.
// Needs no root (a parent may read its child's memory); versions not installed are skipped.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "unwind/python_runtime.h"

namespace strata::unwind {
namespace {

const char* kScript = R"(import sys, time
def leaf():
    sys.stdout.write("ready\n"); sys.stdout.flush(); time.sleep(60)
def recurse(n):
    if n == 0:
        leaf()
    else:
        recurse(n - 1)
def outer():
    recurse(3)
outer()
)";

struct Child {
  pid_t pid = -1;
  ~Child() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

// Starts `python script` and waits for its "ready" line.
bool start(const std::string& python, const std::string& script, Child& child) {
  int fds[2];
  if (pipe(fds) != 0) return false;
  child.pid = fork();
  if (child.pid == 0) {
    dup2(fds[1], 1);
    execl(python.c_str(), python.c_str(), script.c_str(), nullptr);
    _exit(127);
  }
  close(fds[1]);
  char buf[16] = {};
  ssize_t n = read(fds[0], buf, sizeof buf - 1);
  close(fds[0]);
  return n > 0 && std::string(buf).rfind("ready", 0) == 0;
}

struct Loaded {
  std::string path;
  uint64_t start = 0, offset = 0;
};

// The interpreter module (exe or libpython) as mapped in pid, with its load bias parts.
bool find_python_module(pid_t pid, Loaded& out, int& minor) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    std::string range, perms, off, dev, inode, path;
    ss >> range >> perms >> off >> dev >> inode;
    std::getline(ss >> std::ws, path);
    auto m = python_minor_from_path(path);
    if (!m) continue;
    if (std::stoull(off, nullptr, 16) != 0) continue;  // the first mapping: file offset 0
    out.path = path;
    out.start = std::stoull(range.substr(0, range.find('-')), nullptr, 16);
    out.offset = 0;
    minor = *m;
    // A libpython beats the executable that loads it.
    if (path.find("libpython") != std::string::npos) return true;
  }
  return !out.path.empty();
}

void check_interpreter(const std::string& python) {
  if (access(python.c_str(), X_OK) != 0) GTEST_SKIP() << python << " is not installed";
  char tmpl[] = "/tmp/strata-pytest-XXXXXX.py";
  int fd = mkstemps(tmpl, 3);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, kScript, strlen(kScript)), static_cast<ssize_t>(strlen(kScript)));
  close(fd);
  Child child;
  ASSERT_TRUE(start(python, tmpl, child)) << python;
  Loaded mod;
  int minor = 0;
  ASSERT_TRUE(find_python_module(child.pid, mod, minor)) << python;
  auto syms = inspect_python_module(mod.path, minor);
  ASSERT_TRUE(syms.ok()) << syms.error().message;
  // PIE / shared library: addresses are vaddr + (mapping start - first segment's vaddr, which is 0).
  uint64_t bias = mod.start;
  if (syms->runtime >= 0x400000 && mod.start == 0x400000) bias = 0;  // non-PIE executable
  ProcMemReader mem(static_cast<uint32_t>(child.pid));
  ASSERT_TRUE(mem.ok());
  auto offsets = builtin_python_offsets(minor);
  ASSERT_TRUE(offsets.has_value());
  offsets->runtime_addr = syms->runtime + bias;
  if (minor >= 13) {
    auto dbg = python_debug_offsets(mem, syms->runtime + bias);
    ASSERT_TRUE(dbg.ok()) << dbg.error().message;
    // The built-in 3.13 table and the interpreter's own debug offsets agree.
    EXPECT_EQ(dbg->interp_threads_head, offsets->interp_threads_head);
    EXPECT_EQ(dbg->runtime_interpreters_head, offsets->runtime_interpreters_head);
    EXPECT_EQ(dbg->tstate_frame, offsets->tstate_frame);
    EXPECT_EQ(dbg->code_adaptive, offsets->code_adaptive);
    offsets = *dbg;
  }
  // 3.10 matches threads by pthread_self; tid 0 / fsbase 0 takes the only thread there is.
  uint32_t tid = minor >= 11 ? static_cast<uint32_t>(child.pid) : 0;
  auto frames = walk_python_frames(mem, *offsets, tid);
  ASSERT_TRUE(frames.ok()) << frames.error().message;
  std::vector<std::string> names;
  std::vector<int> lines;
  for (const auto& f : *frames) {
    auto code = read_code_object(mem, minor, f.code, syms->code_type + bias);
    ASSERT_TRUE(code.ok()) << code.error().message;
    EXPECT_EQ(code->file, tmpl);
    names.push_back(code->name);
    lines.push_back(code_line(*code, minor, f.lasti));
  }
  // The batched identity check (one process_vm_readv for the sample) agrees with one read per frame,
  // and a code pointer that is no object (an address nothing maps) fails alone.
  std::vector<uint64_t> codes;
  for (const auto& f : *frames) codes.push_back(f.code);
  codes.insert(codes.begin() + 2, 0x10);
  std::vector<uint64_t> ids(codes.size(), 0);
  std::unique_ptr<bool[]> ok(new bool[codes.size()]());
  code_object_identities(mem, minor, codes.data(), codes.size(), ids.data(), ok.get());
  for (size_t i = 0; i < codes.size(); ++i) {
    uint64_t one = 0;
    const bool single = code_object_identity(mem, minor, codes[i], one);
    EXPECT_EQ(ok[i], single) << "code " << i;
    if (single) {
      EXPECT_EQ(ids[i], one) << "code " << i;
    }
  }
  EXPECT_FALSE(ok[2]);
  const std::vector<std::string> want = {"leaf", "recurse", "recurse", "recurse", "recurse", "outer", "<module>"};
  EXPECT_EQ(names, want);
  const std::vector<int> want_lines = {3, 6, 8, 8, 8, 10, 11};
  EXPECT_EQ(lines, want_lines);
  // Every Python-to-Python call here stays inside one eval loop call from 3.11 on; 3.10 enters per frame.
  size_t entries = 0;
  for (const auto& f : *frames) entries += (f.flags & STRATA_PY_FRAME_ENTRY) ? 1 : 0;
  if (minor == 10) EXPECT_EQ(entries, frames->size());
  else EXPECT_EQ(entries, 1u);
  unlink(tmpl);
}

TEST(PythonRuntime, Pyenv310) { check_interpreter("/root/.pyenv/versions/3.10.13/bin/python3.10"); }
TEST(PythonRuntime, Pyenv311) { check_interpreter("/root/.pyenv/versions/3.11.7/bin/python3.11"); }
TEST(PythonRuntime, Pyenv312) { check_interpreter("/root/.pyenv/versions/3.12.1/bin/python3.12"); }
TEST(PythonRuntime, Pyenv313) { check_interpreter("/root/.pyenv/versions/3.13.0/bin/python3.13"); }
TEST(PythonRuntime, Debian311) { check_interpreter("/usr/bin/python3.11"); }

TEST(PythonRuntime, VersionFromPath) {
  EXPECT_EQ(python_minor_from_path("/usr/bin/python3.11"), 11);
  EXPECT_EQ(python_minor_from_path("/x/lib/libpython3.13.so.1.0"), 13);
  EXPECT_EQ(python_minor_from_path("/x/lib/libpython3.10d.so"), 10);
  EXPECT_EQ(python_minor_from_path("/usr/bin/python2.7"), std::nullopt);
  EXPECT_EQ(python_minor_from_path("/usr/lib/python3.11/lib-dynload/_ssl.so"), std::nullopt);
}

TEST(PythonRuntime, LineTable311) {
  // Two entries: short form (line +0) for 2 units, one-line form (+1) for 3 units.
  CodeInfo code;
  code.first_line = 10;
  code.linetable = std::string("\x81\x00\xda\x00\x05", 5);
  // 0x81: kind 0 (short), length 2; 0xda: kind 11 (one-line, +1), length 3, then 2 column bytes.
  EXPECT_EQ(code_line(code, 11, 0), 10);
  EXPECT_EQ(code_line(code, 11, 1), 10);
  EXPECT_EQ(code_line(code, 11, 2), 11);
  EXPECT_EQ(code_line(code, 11, 4), 11);
}

// read_many on a live process: ranges before and after one that cannot be read are read whole, and
// the bad one alone fails (process_vm_readv stops at it).
TEST(PythonRuntime, ProcMemReadManyStopsOnlyAtTheBadRange) {
  Child child;
  child.pid = fork();
  if (child.pid == 0) {
    pause();
    _exit(0);
  }
  static const uint64_t values[4] = {0x1111, 0x2222, 0x3333, 0x4444};  // the same address in the child
  ProcMemReader mem(static_cast<uint32_t>(child.pid));
  ASSERT_TRUE(mem.ok());
  uint64_t got[5] = {};
  const MemoryReader::Range ranges[5] = {{reinterpret_cast<uint64_t>(&values[0]), &got[0], 8},
                                         {reinterpret_cast<uint64_t>(&values[1]), &got[1], 8},
                                         {0x10, &got[2], 8},
                                         {reinterpret_cast<uint64_t>(&values[2]), &got[3], 8},
                                         {reinterpret_cast<uint64_t>(&values[3]), &got[4], 8}};
  bool ok[5] = {};
  mem.read_many(ranges, 5, ok);
  EXPECT_TRUE(ok[0] && ok[1] && ok[3] && ok[4]);
  EXPECT_FALSE(ok[2]);
  EXPECT_EQ(got[0], 0x1111u);
  EXPECT_EQ(got[1], 0x2222u);
  EXPECT_EQ(got[3], 0x3333u);
  EXPECT_EQ(got[4], 0x4444u);
}

TEST(PythonRuntime, HostileMemoryNeverCrashes) {
  ImageMemReader mem;
  std::vector<uint8_t> junk(4096);
  uint64_t seed = 3;
  for (auto& b : junk) b = static_cast<uint8_t>((seed = seed * 6364136223846793005ull + 1) >> 56);
  mem.add(0x1000, junk);
  for (int minor = 10; minor <= 13; ++minor) {
    auto o = builtin_python_offsets(minor);
    o->runtime_addr = 0x1000;
    (void)walk_python_frames(mem, *o, 1);
    for (uint64_t a = 0x1000; a < 0x2000; a += 8) (void)read_code_object(mem, minor, a, 0);
    std::vector<uint64_t> codes, ids(512);
    for (uint64_t a = 0x1000; a < 0x2000; a += 8) codes.push_back(a);
    std::unique_ptr<bool[]> ok(new bool[codes.size()]());
    code_object_identities(mem, minor, codes.data(), codes.size(), ids.data(), ok.get());
  }
}

}  // namespace
}  // namespace strata::unwind
