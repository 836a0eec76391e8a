#include "agent/shipper/spool.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "common/parse.h"

namespace strata::agent::shipper {
namespace {

// Files are "<seq, 16 hex digits>.batch": lexical order is arrival order across restarts.
std::string file_name(uint64_t seq) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016" PRIx64 ".batch", seq);
  return buf;
}

Status make_dirs(const std::string& dir) {
  std::string path;
  std::stringstream ss(dir);
  std::string part;
  if (!dir.empty() && dir[0] == '/') path = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    path += part + "/";
    if (mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) return Error::from_errno("creating spool " + path, errno);
  }
  return {};
}

}  // namespace

Spool::Spool(Spool&& o) noexcept
    : dir_(std::move(o.dir_)), max_bytes_(o.max_bytes_), entries_(std::move(o.entries_)), bytes_(o.bytes_),
      next_seq_(o.next_seq_), dropped_(o.dropped_), write_failures_(o.write_failures_),
      quarantined_(o.quarantined_), pinned_(o.pinned_) {}

Result<Spool> Spool::open(const std::string& dir, uint64_t max_bytes) {
  if (auto st = make_dirs(dir); !st) return st.error().environment();
  Spool s;
  s.dir_ = dir;
  s.max_bytes_ = max_bytes;
  DIR* d = opendir(dir.c_str());
  if (!d) return Error::from_errno("opening spool " + dir, errno).environment();
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name.size() != 22 || name.substr(16) != ".batch") {
      if (name.size() > 4 && name.substr(name.size() - 4) == ".tmp") unlink((dir + "/" + name).c_str());
      continue;
    }
    auto parsed = parse_int<uint64_t>(std::string_view(name).substr(0, 16), 16);
    if (!parsed) continue;  // not one of ours
    uint64_t seq = *parsed;
    struct stat st{};
    if (stat((dir + "/" + name).c_str(), &st) != 0) continue;
    s.entries_.push_back({dir + "/" + name, seq, static_cast<uint64_t>(st.st_size)});
    s.bytes_ += static_cast<uint64_t>(st.st_size);
    s.next_seq_ = std::max(s.next_seq_, seq + 1);
  }
  closedir(d);
  std::sort(s.entries_.begin(), s.entries_.end(), [](const Entry& a, const Entry& b) { return a.seq < b.seq; });
  return s;
}

Result<uint64_t> Spool::push(const std::string& bytes, std::vector<uint64_t>& dropped) {
  std::lock_guard lock(mu_);
  if (bytes.size() > max_bytes_) {  // larger than the whole spool: kept nowhere, the others stay
    ++dropped_;
    return uint64_t{0};
  }
  // Oldest first, passing over the batch being sent.
  for (size_t i = 0; i < entries_.size() && bytes_ + bytes.size() > max_bytes_;) {
    if (entries_[i].seq == pinned_) {
      ++i;
      continue;
    }
    unlink(entries_[i].path.c_str());
    bytes_ -= entries_[i].bytes;
    dropped.push_back(entries_[i].seq);
    entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i));
    ++dropped_;
  }
  if (bytes_ + bytes.size() > max_bytes_) {  // only the batch being sent is left, and this one is too big
    ++dropped_;
    return uint64_t{0};
  }
  uint64_t seq = next_seq_++;
  std::string path = dir_ + "/" + file_name(seq);
  std::string tmp = path + ".tmp";
  // A disk that is full or failing costs this batch, counted, never the agent: the job it watches
  // goes on, and so does shipping what is already spooled.
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) {
      unlink(tmp.c_str());
      ++dropped_;
      ++write_failures_;
      return uint64_t{0};
    }
  }
  // rename: a crash leaves the old state or the new file, never half a batch.
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    unlink(tmp.c_str());
    ++dropped_;
    ++write_failures_;
    return uint64_t{0};
  }
  entries_.push_back({path, seq, bytes.size()});
  bytes_ += bytes.size();
  return seq;
}

std::optional<Spool::Entry> Spool::oldest() const {
  std::lock_guard lock(mu_);
  if (entries_.empty()) return std::nullopt;
  return entries_.front();
}

Result<std::string> Spool::read(const Entry& e) const {
  std::ifstream in(e.path, std::ios::binary);
  if (!in) return Error{"reading spool file " + e.path};
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return data;
}

std::optional<Spool::Entry> Spool::checkout() {
  std::lock_guard lock(mu_);
  if (entries_.empty()) return std::nullopt;
  pinned_ = entries_.front().seq;
  return entries_.front();
}

std::optional<Spool::Entry> Spool::checkout(uint64_t seq) {
  std::lock_guard lock(mu_);
  auto it = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& x) { return x.seq == seq; });
  if (it == entries_.end()) return std::nullopt;
  pinned_ = seq;
  return *it;
}

std::vector<Spool::Entry> Spool::entries() const {
  std::lock_guard lock(mu_);
  return entries_;
}

Result<std::string> Spool::quarantine(const Entry& e) {
  std::lock_guard lock(mu_);
  if (pinned_ == e.seq) pinned_ = 0;
  auto it = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& x) { return x.seq == e.seq; });
  if (it == entries_.end()) return Error{"batch " + std::to_string(e.seq) + " is no longer spooled"};
  const std::string qdir = quarantine_dir();
  if (mkdir(qdir.c_str(), 0700) != 0 && errno != EEXIST) return Error::from_errno("creating " + qdir, errno);
  std::string to = qdir + "/" + file_name(e.seq);
  Status moved = rename(it->path.c_str(), to.c_str()) == 0 ? Status{} : Error::from_errno("moving " + it->path + " to " + qdir, errno);
  if (!moved) unlink(it->path.c_str());  // it must leave the spool either way, or it is sent forever
  bytes_ -= it->bytes;
  entries_.erase(it);
  ++quarantined_;
  // The newest kQuarantineKeep stay; names sort in arrival order.
  std::vector<std::string> kept;
  if (DIR* d = opendir(qdir.c_str())) {
    while (dirent* f = readdir(d)) {
      if (f->d_name[0] != '.') kept.push_back(f->d_name);
    }
    closedir(d);
  }
  std::sort(kept.begin(), kept.end());
  for (size_t i = 0; i + kQuarantineKeep < kept.size(); ++i) unlink((qdir + "/" + kept[i]).c_str());
  if (!moved) return moved.error();
  return to;
}

uint64_t Spool::quarantined() const {
  std::lock_guard lock(mu_);
  return quarantined_;
}

void Spool::release() {
  std::lock_guard lock(mu_);
  pinned_ = 0;
}

void Spool::remove(const Entry& e) {
  std::lock_guard lock(mu_);
  if (pinned_ == e.seq) pinned_ = 0;
  auto it = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& x) { return x.seq == e.seq; });
  if (it == entries_.end()) return;  // dropped meanwhile
  unlink(it->path.c_str());
  bytes_ -= it->bytes;
  entries_.erase(it);
}

uint64_t Spool::bytes() const {
  std::lock_guard lock(mu_);
  return bytes_;
}
uint64_t Spool::count() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}
uint64_t Spool::dropped() const {
  std::lock_guard lock(mu_);
  return dropped_;
}

uint64_t Spool::write_failures() const {
  std::lock_guard lock(mu_);
  return write_failures_;
}

}  // namespace strata::agent::shipper
