#include <cxxabi.h>

#include <cstdlib>
#include <memory>

#include "symbolize/symbolizer.h"

namespace strata::symbolize {

namespace {
struct FreeDeleter {
  void operator()(char* p) const { std::free(p); }  // __cxa_demangle allocates with malloc
};
}  // namespace

std::string demangle(const std::string& name) {
  // Only Itanium-mangled names; C names such as "main" would otherwise be tried as types.
  if (name.size() < 3 || name.compare(0, 2, "_Z") != 0) return name;
  // "foo@@GLIBCXX_3.4" style versions in .dynsym names are not part of the mangling.
  std::string mangled = name;
  std::string version;
  if (auto at = name.find('@'); at != std::string::npos) {
    mangled = name.substr(0, at);
    version = name.substr(at);
  }
  int status = 0;
  std::unique_ptr<char, FreeDeleter> out(abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status));
  if (status != 0 || !out) return name;
  return std::string(out.get()) + version;
}

}  // namespace strata::symbolize
