// Runs a fuzz target's entry function over files without libFuzzer: every corpus seed and every
// committed regression input (tests/fuzz/regressions/<target>/), so inputs that once crashed a
// parser are replayed by `make test` with the ordinary compiler. Arguments: files or folders.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

int run_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) {
    std::fprintf(stderr, "cannot read %s\n", p.c_str());
    return 1;
  }
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  int failures = 0;
  size_t inputs = 0;
  for (int i = 1; i < argc; ++i) {
    fs::path arg(argv[i]);
    std::error_code ec;
    if (fs::is_directory(arg, ec)) {
      std::vector<fs::path> files;
      for (const auto& e : fs::recursive_directory_iterator(arg)) {
        if (e.is_regular_file() && e.path().filename() != "README.md") files.push_back(e.path());
      }
      std::sort(files.begin(), files.end());  // a stable order makes a failure easy to find again
      for (const auto& f : files) {
        failures += run_file(f);
        ++inputs;
      }
    } else if (fs::exists(arg, ec)) {
      failures += run_file(arg);
      ++inputs;
    }  // a target without regressions yet has no folder: nothing to replay
  }
  std::printf("replayed %zu inputs\n", inputs);
  return failures ? 1 : 0;
}
