// Helpers shared by the fuzz targets: fuzz bytes as a file (for parsers that take a path) and as a
// small stream of typed values. Header only, so the targets stay one file each.
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace strata::fuzz {

// The bytes in an anonymous in-memory file, named by /proc/self/fd/N: parsers that open a path read
// them without touching the disk. Closed (and gone) when this object dies.
class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size) {
    fd_ = memfd_create("strata-fuzz", 0);
    if (fd_ < 0) return;
    size_t done = 0;
    while (done < size) {
      ssize_t n = ::write(fd_, data + done, size - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
  }
  ~MemFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  bool ok() const { return fd_ >= 0; }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_ = -1;
};

// Consumes fuzz bytes front to back; past the end everything reads as zero.
class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  template <typename T>
  T take() {
    T v{};
    size_t n = std::min(sizeof(T), size_ - pos_);
    if (n) std::memcpy(&v, data_ + pos_, n);
    pos_ += n;
    return v;
  }
  // A string up to the next '\n' (or the end).
  std::string line() {
    size_t start = pos_;
    while (pos_ < size_ && data_[pos_] != '\n') ++pos_;
    std::string s(reinterpret_cast<const char*>(data_ + start), pos_ - start);
    if (pos_ < size_) ++pos_;
    return s;
  }
  const uint8_t* rest() const { return data_ + pos_; }
  size_t remaining() const { return size_ - pos_; }
  bool done() const { return pos_ >= size_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace strata::fuzz
