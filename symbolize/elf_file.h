// Internal to symbolize/: a libelf handle on a file descriptor, opened so that hostile input gives
// an Error instead of a crash.
#pragma once

#include <gelf.h>
#include <libelf.h>
#include <sys/stat.h>

#include <memory>
#include <string>

#include "common/result.h"

namespace strata::symbolize {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();
  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

struct ElfDeleter {
  void operator()(Elf* e) const { elf_end(e); }
};
using ElfPtr = std::unique_ptr<Elf, ElfDeleter>;

struct ElfHandle {
  std::string path;
  UniqueFd fd;
  ElfPtr elf;  // declared after fd: destroyed first
  struct stat st {};
};

// Opens a regular file as ELF (ELF_C_READ: data is read with pread, never mapped, so a file
// truncated under us reads short instead of raising SIGBUS).
Result<ElfHandle> open_elf(const std::string& path);

// The GNU build id note as lowercase hex; empty when the file has none.
std::string elf_build_id(Elf* elf);

}  // namespace strata::symbolize
