#include "agent/runtimes/library_closure.h"

#include <unistd.h>

#include <deque>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "symbolize/exports.h"

namespace strata::agent {
namespace {

std::vector<std::string> split_paths(const std::string& s, const std::string& origin) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    for (const std::string tok : {"$ORIGIN", "${ORIGIN}"}) {
      for (size_t p = dir.find(tok); p != std::string::npos; p = dir.find(tok)) dir.replace(p, tok.size(), origin);
    }
    if (!dir.empty()) out.push_back(dir);
  }
  return out;
}

std::vector<std::string> system_dirs() {
  std::vector<std::string> dirs;
  // /etc/ld.so.conf.d lists the extra directories (CUDA's among them on GPU nodes).
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/etc/ld.so.conf.d", ec)) {
    if (entry.path().extension() != ".conf") continue;
    std::ifstream in(entry.path());
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty() && line[0] == '/') dirs.push_back(line);
    }
  }
  for (const char* d : {"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib",
                        "/usr/lib", "/usr/local/lib"})
    dirs.push_back(d);
  return dirs;
}

}  // namespace

std::vector<std::string> library_closure(const std::string& exe, const std::string& ld_library_path,
                                         const std::string& root, size_t limit) {
  static const std::vector<std::string> sys = system_dirs();
  std::vector<std::string> out;
  std::set<std::string> seen_names, seen_paths;
  std::deque<std::string> todo{exe};
  seen_paths.insert(exe);
  while (!todo.empty() && out.size() < limit) {
    std::string obj = todo.front();
    todo.pop_front();
    auto ex = symbolize::read_exported_functions(root + obj);
    if (!ex) continue;
    if (obj != exe) out.push_back(obj);
    std::string origin = obj.substr(0, obj.rfind('/'));
    std::vector<std::string> dirs;
    if (ex->runpath.empty()) {
      for (auto& d : split_paths(ex->rpath, origin)) dirs.push_back(d);
    }
    for (auto& d : split_paths(ld_library_path, origin)) dirs.push_back(d);
    for (auto& d : split_paths(ex->runpath, origin)) dirs.push_back(d);
    dirs.insert(dirs.end(), sys.begin(), sys.end());
    for (const auto& name : ex->needed) {
      if (!seen_names.insert(name).second) continue;
      std::string found;
      if (name.find('/') != std::string::npos) {
        found = name;
      } else {
        for (const auto& d : dirs) {
          std::string cand = d + "/" + name;
          if (access((root + cand).c_str(), R_OK) == 0) {
            found = cand;
            break;
          }
        }
      }
      if (!found.empty() && seen_paths.insert(found).second) todo.push_back(found);
    }
  }
  return out;
}

}  // namespace strata::agent
