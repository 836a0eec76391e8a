#include "symbolize/elf_file.h"

#include <elfutils/libdwelf.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

namespace strata::symbolize {

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

Result<ElfHandle> open_elf(const std::string& path) {
  // libelf refuses to work until a version is set; once per process is enough but is cheap.
  if (elf_version(EV_CURRENT) == EV_NONE) return Error{"libelf: " + std::string(elf_errmsg(-1))};
  ElfHandle h;
  h.path = path;
  // O_NONBLOCK: a FIFO planted at the path must not hang us; it is rejected below.
  h.fd = UniqueFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (h.fd.get() < 0) return Error::from_errno("cannot open " + path, errno);
  if (::fstat(h.fd.get(), &h.st) != 0) return Error::from_errno("cannot stat " + path, errno);
  if (!S_ISREG(h.st.st_mode)) return Error{path + " is not a regular file"};
  h.elf.reset(elf_begin(h.fd.get(), ELF_C_READ, nullptr));
  if (!h.elf) return Error{"cannot read " + path + " as ELF: " + elf_errmsg(-1)};
  if (elf_kind(h.elf.get()) != ELF_K_ELF) return Error{path + " is not an ELF file"};
  GElf_Ehdr ehdr;
  if (gelf_getehdr(h.elf.get(), &ehdr) == nullptr) {
    return Error{path + ": bad ELF header: " + elf_errmsg(-1)};
  }
  return h;
}

std::string elf_build_id(Elf* elf) {
  const void* bytes = nullptr;
  ssize_t n = dwelf_elf_gnu_build_id(elf, &bytes);
  if (n <= 0 || bytes == nullptr) return {};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(static_cast<size_t>(n) * 2);
  for (ssize_t i = 0; i < n; ++i) {
    auto b = static_cast<const unsigned char*>(bytes)[i];
    hex.push_back(kHex[b >> 4]);
    hex.push_back(kHex[b & 0xf]);
  }
  return hex;
}

}  // namespace strata::symbolize
