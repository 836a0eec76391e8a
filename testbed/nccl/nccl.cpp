// libnccl.so.2 stand-in: the NCCL 2.28 API over TCP between rank processes.
//
// Compiled against the toolkit's own nccl.h, so every exported function has the real signature.
// As in the real library, each API function is defined as pnccl<Name> (strong) and exported as
// nccl<Name> (a weak alias), the hook NCCL keeps for profilers.
//
// Bootstrap follows NCCL's shape: ncclGetUniqueId starts a root listener in the calling process
// and encodes its address in the id; every rank of ncclCommInitRank reports its own listening
// port there, learns everyone's address, and the ranks connect a full mesh. A collective is
// enqueued on the caller's stream (like NCCL's kernel) and runs on the stream's worker: a ring
// over the mesh that really moves and reduces the bytes, so a late rank makes its peers wait in
// the collective and a slow link slows the whole ring.
#include <nccl.h>

#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "testbed/common/testbed_env.h"
#include "testbed/cuda/cudart_internal.h"
#include "testbed/nccl/transport.h"

#define TESTBED_EXPORT __attribute__((visibility("default")))

// ---- ncclDevKernel_* host stubs ---------------------------------------------------------------
// What the device timeline names a collective by, as Nsight / CUPTI name NCCL's kernels:
// "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)".
template <unsigned long N>
struct ncclDevKernelArgsStorage {
  alignas(16) char storage[N];
};
using ncclDevKernelArgs4K = ncclDevKernelArgsStorage<4096>;

namespace {
volatile int g_stub_mark;
}

#define TESTBED_STUB __attribute__((visibility("default"), noinline, used))
// Types in ncclDataType_t order; ops: Sum, Prod, MinMax (Max and Min), PreMulSum (Avg).
#define NCCL_STUB_TYPES(X, coll, op) \
  X(coll, op, i8) X(coll, op, u8) X(coll, op, i32) X(coll, op, u32) X(coll, op, i64) \
  X(coll, op, u64) X(coll, op, f16) X(coll, op, f32) X(coll, op, f64) X(coll, op, bf16) \
  X(coll, op, f8e4m3) X(coll, op, f8e5m2)
#define NCCL_STUB_OPS(X, coll) \
  NCCL_STUB_TYPES(X, coll, Sum) NCCL_STUB_TYPES(X, coll, Prod) \
  NCCL_STUB_TYPES(X, coll, MinMax) NCCL_STUB_TYPES(X, coll, PreMulSum)
#define NCCL_DEFINE_STUB(coll, op, ty)                                                   \
  TESTBED_STUB void ncclDevKernel_##coll##_##op##_##ty##_RING_LL(ncclDevKernelArgs4K a) { \
    g_stub_mark = __COUNTER__ + a.storage[0];                                            \
  }
#define NCCL_STUB_ADDR(coll, op, ty) reinterpret_cast<const void*>(&ncclDevKernel_##coll##_##op##_##ty##_RING_LL),

NCCL_STUB_OPS(NCCL_DEFINE_STUB, AllReduce)
NCCL_STUB_OPS(NCCL_DEFINE_STUB, Reduce)
NCCL_STUB_OPS(NCCL_DEFINE_STUB, ReduceScatter)
TESTBED_STUB void ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgs4K a) { g_stub_mark = 9001 + a.storage[0]; }
TESTBED_STUB void ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgs4K a) { g_stub_mark = 9002 + a.storage[0]; }
TESTBED_STUB void ncclDevKernel_SendRecv(ncclDevKernelArgs4K a) { g_stub_mark = 9003 + a.storage[0]; }

namespace testbed::nccl {
namespace {

const void* const kAllReduceStubs[] = {NCCL_STUB_OPS(NCCL_STUB_ADDR, AllReduce)};
const void* const kReduceStubs[] = {NCCL_STUB_OPS(NCCL_STUB_ADDR, Reduce)};
const void* const kReduceScatterStubs[] = {NCCL_STUB_OPS(NCCL_STUB_ADDR, ReduceScatter)};
static_assert(sizeof(kAllReduceStubs) / sizeof(void*) == 4 * ncclNumTypes, "one stub per op x type");

using strata::Error;
using strata::Status;

// ---- unique id and bootstrap -------------------------------------------------------------------
constexpr uint32_t kIdMagic = 0x434e5453;  // "STNC"

struct IdPayload {
  uint32_t magic;
  uint32_t version;
  uint32_t ip_be;    // root listener address, network order
  uint16_t port_be;  // root listener port, network order
  uint16_t pad;
  uint64_t nonce;    // tells communicators apart
};
static_assert(sizeof(IdPayload) <= NCCL_UNIQUE_ID_BYTES);

struct Hello {
  uint32_t magic;
  int32_t rank;
  int32_t nranks;
  uint16_t port_be;  // the rank's data listener
  uint16_t pad;
};

struct PeerAddr {
  uint32_t ip_be;
  uint16_t port_be;
  uint16_t pad;
};

// The address ranks reach this process's root listener at: NCCL_COMM_ID's host, else
// STRATA_TESTBED_BOOTSTRAP_ADDR, else MASTER_ADDR (torchrun's), else the loopback.
uint32_t bootstrap_ip() {
  for (const char* var : {"NCCL_COMM_ID", "STRATA_TESTBED_BOOTSTRAP_ADDR", "MASTER_ADDR"}) {
    const char* v = std::getenv(var);
    if (v == nullptr || *v == 0) continue;
    std::string host(v);
    if (auto colon = host.find(':'); colon != std::string::npos) host.resize(colon);
    if (host == "localhost") host = "127.0.0.1";
    in_addr a{};
    if (::inet_pton(AF_INET, host.c_str(), &a) == 1) return a.s_addr;
  }
  return htonl(INADDR_LOOPBACK);
}

// Root: collects every rank's (address, port), sends the table to all, exits.
void bootstrap_root(int listen_fd) {
  std::vector<int> fds;
  std::vector<PeerAddr> table;
  int nranks = -1;
  int joined = 0;
  while (nranks < 0 || joined < nranks) {
    auto fd = accept_one(listen_fd);
    if (!fd.ok()) break;
    Hello hello{};
    sockaddr_in peer{};
    socklen_t plen = sizeof(peer);
    if (!recv_all(*fd, &hello, sizeof(hello)).ok() || hello.magic != kIdMagic || hello.nranks <= 0 ||
        hello.rank < 0 || hello.rank >= hello.nranks || (nranks >= 0 && hello.nranks != nranks) ||
        ::getpeername(*fd, reinterpret_cast<sockaddr*>(&peer), &plen) != 0) {
      ::close(*fd);
      continue;
    }
    if (nranks < 0) {
      nranks = hello.nranks;
      fds.assign(static_cast<size_t>(nranks), -1);
      table.assign(static_cast<size_t>(nranks), PeerAddr{});
    }
    if (fds[hello.rank] >= 0) ::close(fds[hello.rank]);
    else ++joined;
    fds[hello.rank] = *fd;
    // The address the rank came from is the one its peers can reach it at (as NCCL's bootstrap).
    table[hello.rank] = PeerAddr{peer.sin_addr.s_addr, hello.port_be, 0};
  }
  for (int fd : fds) {
    if (fd < 0) continue;
    (void)send_all(fd, table.data(), table.size() * sizeof(PeerAddr));
    ::close(fd);
  }
  ::close(listen_fd);
}

// ---- communicator ------------------------------------------------------------------------------
struct CommState {
  int rank = 0;
  int nranks = 1;
  int device = 0;
  uint64_t hash = 0;
  std::vector<int> peers;  // socket per peer rank, -1 for self
  std::atomic<int> async_error{ncclSuccess};
  std::mutex m;
  std::string last_error;

  ~CommState() {
    for (int fd : peers) {
      if (fd >= 0) ::close(fd);
    }
  }
  void fail(const std::string& what) {
    std::lock_guard lock(m);
    if (async_error.exchange(ncclRemoteError) == ncclSuccess) {
      std::fprintf(stderr, "testbed nccl: rank %d/%d (comm %016llx): %s\n", rank, nranks,
                   static_cast<unsigned long long>(hash), what.c_str());
    }
    last_error = what;
  }
};

}  // namespace
}  // namespace testbed::nccl

struct ncclComm {
  std::shared_ptr<testbed::nccl::CommState> state;  // kept alive by work still on a stream
};

namespace testbed::nccl {
namespace {

enum class Coll { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kReduce, kSend, kRecv };

const char* coll_name(Coll c) {
  switch (c) {
    case Coll::kAllReduce: return "AllReduce";
    case Coll::kAllGather: return "AllGather";
    case Coll::kReduceScatter: return "ReduceScatter";
    case Coll::kBroadcast: return "Broadcast";
    case Coll::kReduce: return "Reduce";
    case Coll::kSend: return "Send";
    case Coll::kRecv: return "Recv";
  }
  return "?";
}

struct Task {
  Coll coll = Coll::kAllReduce;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  // elements: per rank for AllGather (send), ReduceScatter (recv)
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  int peer = 0;  // root for Broadcast/Reduce, peer for Send/Recv
  std::shared_ptr<CommState> comm;
  cudaStream_t stream = nullptr;
};

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

size_t payload_bytes(const Task& t) {
  size_t n = t.count * type_size(t.type);
  if (t.coll == Coll::kAllGather || t.coll == Coll::kReduceScatter) n *= static_cast<size_t>(t.comm->nranks);
  return n;
}

const void* stub_for(const Task& t) {
  int op_index = 0;
  switch (t.op) {
    case ncclSum: op_index = 0; break;
    case ncclProd: op_index = 1; break;
    case ncclMax: case ncclMin: op_index = 2; break;
    default: op_index = 3; break;  // Avg and custom ops are PreMulSum kernels in NCCL
  }
  size_t i = static_cast<size_t>(op_index) * ncclNumTypes + static_cast<size_t>(t.type);
  switch (t.coll) {
    case Coll::kAllReduce: return kAllReduceStubs[i];
    case Coll::kReduce: return kReduceStubs[i];
    case Coll::kReduceScatter: return kReduceScatterStubs[i];
    case Coll::kAllGather: return reinterpret_cast<const void*>(&ncclDevKernel_AllGather_RING_LL);
    case Coll::kBroadcast: return reinterpret_cast<const void*>(&ncclDevKernel_Broadcast_RING_LL);
    default: return reinterpret_cast<const void*>(&ncclDevKernel_SendRecv);
  }
}

// ---- reductions on host memory (the testbed's "device" memory) ---------------------------------
float half_to_float(uint16_t h) {
  uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float v;
  if (exp == 0) v = std::ldexp(static_cast<float>(man), -24);
  else if (exp == 31) v = man ? NAN : INFINITY;
  else v = std::ldexp(static_cast<float>(man | 0x400), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}
uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  int exp = static_cast<int>((x >> 23) & 0xff) - 127 + 15;
  uint32_t man = x & 0x7fffff;
  if (exp <= 0) return static_cast<uint16_t>(sign);  // flush tiny values to zero
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00);
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(exp) << 10) | (man >> 13));
}
float bf16_to_float(uint16_t b) {
  uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return static_cast<uint16_t>(x >> 16);
}

template <typename T>
T apply(ncclRedOp_t op, T a, T b) {
  switch (op) {
    case ncclProd: return static_cast<T>(a * b);
    case ncclMax: return a > b ? a : b;
    case ncclMin: return a < b ? a : b;
    default: return static_cast<T>(a + b);  // Sum, and Avg (divided at the end)
  }
}

template <typename T>
void reduce_typed(void* dst, const void* src, size_t n, ncclRedOp_t op) {
  auto* d = static_cast<T*>(dst);
  auto* s = static_cast<const T*>(src);
  for (size_t i = 0; i < n; ++i) d[i] = apply(op, d[i], s[i]);
}

template <float (*To)(uint16_t), uint16_t (*From)(float)>
void reduce_16(void* dst, const void* src, size_t n, ncclRedOp_t op) {
  auto* d = static_cast<uint16_t*>(dst);
  auto* s = static_cast<const uint16_t*>(src);
  for (size_t i = 0; i < n; ++i) d[i] = From(apply(op, To(d[i]), To(s[i])));
}

// dst[i] = dst[i] (op) src[i]. fp8 values are carried, not reduced (the testbed has no fp8 math).
void reduce_into(void* dst, const void* src, size_t n, ncclDataType_t t, ncclRedOp_t op) {
  switch (t) {
    case ncclInt8: reduce_typed<int8_t>(dst, src, n, op); break;
    case ncclUint8: reduce_typed<uint8_t>(dst, src, n, op); break;
    case ncclInt32: reduce_typed<int32_t>(dst, src, n, op); break;
    case ncclUint32: reduce_typed<uint32_t>(dst, src, n, op); break;
    case ncclInt64: reduce_typed<int64_t>(dst, src, n, op); break;
    case ncclUint64: reduce_typed<uint64_t>(dst, src, n, op); break;
    case ncclFloat32: reduce_typed<float>(dst, src, n, op); break;
    case ncclFloat64: reduce_typed<double>(dst, src, n, op); break;
    case ncclFloat16: reduce_16<half_to_float, float_to_half>(dst, src, n, op); break;
    case ncclBfloat16: reduce_16<bf16_to_float, float_to_bf16>(dst, src, n, op); break;
    default: break;
  }
}

template <typename T>
void divide_typed(void* buf, size_t n, int by) {
  auto* p = static_cast<T*>(buf);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] / static_cast<T>(by));
}

void finish_avg(void* buf, size_t n, ncclDataType_t t, ncclRedOp_t op, int nranks) {
  if (op != ncclAvg) return;
  switch (t) {
    case ncclInt8: divide_typed<int8_t>(buf, n, nranks); break;
    case ncclUint8: divide_typed<uint8_t>(buf, n, nranks); break;
    case ncclInt32: divide_typed<int32_t>(buf, n, nranks); break;
    case ncclUint32: divide_typed<uint32_t>(buf, n, nranks); break;
    case ncclInt64: divide_typed<int64_t>(buf, n, nranks); break;
    case ncclUint64: divide_typed<uint64_t>(buf, n, nranks); break;
    case ncclFloat32: divide_typed<float>(buf, n, nranks); break;
    case ncclFloat64: divide_typed<double>(buf, n, nranks); break;
    case ncclFloat16: {
      auto* p = static_cast<uint16_t*>(buf);
      for (size_t i = 0; i < n; ++i) p[i] = float_to_half(half_to_float(p[i]) / static_cast<float>(nranks));
      break;
    }
    case ncclBfloat16: {
      auto* p = static_cast<uint16_t*>(buf);
      for (size_t i = 0; i < n; ++i) p[i] = float_to_bf16(bf16_to_float(p[i]) / static_cast<float>(nranks));
      break;
    }
    default: break;
  }
}

// ---- ring algorithms ---------------------------------------------------------------------------
struct Ring {
  CommState& c;
  Pacer& pacer;
  int next() const { return (c.rank + 1) % c.nranks; }
  int prev() const { return (c.rank + c.nranks - 1) % c.nranks; }
  Status step(const void* send, size_t send_len, void* recv, size_t recv_len) {
    std::vector<Transfer> t;
    t.push_back(Transfer{c.peers[next()], true, static_cast<char*>(const_cast<void*>(send)), send_len, 0});
    t.push_back(Transfer{c.peers[prev()], false, static_cast<char*>(recv), recv_len, 0});
    return run_transfers(t, pacer);
  }
};

int mod(int a, int n) { return ((a % n) + n) % n; }

// Element range of chunk i of n over count elements.
std::pair<size_t, size_t> chunk(size_t count, int n, int i) {
  size_t base = count / static_cast<size_t>(n), extra = count % static_cast<size_t>(n);
  auto ui = static_cast<size_t>(i);
  size_t begin = ui * base + std::min(ui, extra);
  return {begin, base + (ui < extra ? 1 : 0)};
}

// Reduce-scatter over `buf` (count elements) so that rank r ends with chunk r fully reduced.
Status ring_reduce_scatter(Ring& ring, char* buf, size_t count, ncclDataType_t type, ncclRedOp_t op) {
  const int n = ring.c.nranks, r = ring.c.rank;
  const size_t es = type_size(type);
  std::vector<char> tmp(chunk(count, n, 0).second * es);
  for (int s = 0; s < n - 1; ++s) {
    auto [sb, sn] = chunk(count, n, mod(r - s - 1, n));
    auto [rb, rn] = chunk(count, n, mod(r - s - 2, n));
    if (auto st = ring.step(buf + sb * es, sn * es, tmp.data(), rn * es); !st.ok()) return st;
    reduce_into(buf + rb * es, tmp.data(), rn, type, op);
  }
  return {};
}

// All-gather of `count` elements split in n chunks where rank r holds chunk r.
Status ring_all_gather_chunks(Ring& ring, char* buf, size_t count, size_t es) {
  const int n = ring.c.nranks, r = ring.c.rank;
  for (int s = 0; s < n - 1; ++s) {
    auto [sb, sn] = chunk(count, n, mod(r - s, n));
    auto [rb, rn] = chunk(count, n, mod(r - s - 1, n));
    if (auto st = ring.step(buf + sb * es, sn * es, buf + rb * es, rn * es); !st.ok()) return st;
  }
  return {};
}

Status run_task(Task& t, Pacer& pacer) {
  CommState& c = *t.comm;
  Ring ring{c, pacer};
  const size_t es = type_size(t.type);
  const int n = c.nranks;
  switch (t.coll) {
    case Coll::kAllReduce:
    case Coll::kReduce: {
      // Reduce = all-reduce whose result only the root keeps: simple, and the bytes still move.
      std::vector<char> scratch;
      char* buf = static_cast<char*>(t.recv);
      if (t.coll == Coll::kReduce && c.rank != t.peer) {
        scratch.resize(t.count * es);
        buf = scratch.data();
      }
      if (t.count > 0 && buf != t.send) std::memmove(buf, t.send, t.count * es);
      if (n > 1) {
        if (auto st = ring_reduce_scatter(ring, buf, t.count, t.type, t.op); !st.ok()) return st;
        if (auto st = ring_all_gather_chunks(ring, buf, t.count, es); !st.ok()) return st;
      }
      finish_avg(buf, t.count, t.type, t.op, n);
      return {};
    }
    case Coll::kReduceScatter: {
      size_t total = t.count * static_cast<size_t>(n);
      std::vector<char> work(static_cast<const char*>(t.send), static_cast<const char*>(t.send) + total * es);
      if (n > 1) {
        // Chunks are exactly t.count elements each here, so chunk r is rank r's slice.
        if (auto st = ring_reduce_scatter(ring, work.data(), total, t.type, t.op); !st.ok()) return st;
      }
      std::memcpy(t.recv, work.data() + static_cast<size_t>(c.rank) * t.count * es, t.count * es);
      finish_avg(t.recv, t.count, t.type, t.op, n);
      return {};
    }
    case Coll::kAllGather: {
      char* out = static_cast<char*>(t.recv);
      size_t bytes = t.count * es;
      char* mine = out + static_cast<size_t>(c.rank) * bytes;
      if (bytes > 0 && mine != t.send) std::memmove(mine, t.send, bytes);
      if (n > 1) return ring_all_gather_chunks(ring, out, t.count * static_cast<size_t>(n), es);
      return {};
    }
    case Coll::kBroadcast: {
      size_t bytes = t.count * es;
      if (c.rank == t.peer && bytes > 0 && t.recv != t.send) std::memmove(t.recv, t.send, bytes);
      if (n == 1) return {};
      if (c.rank != t.peer) {
        std::vector<Transfer> in{Transfer{c.peers[ring.prev()], false, static_cast<char*>(t.recv), bytes, 0}};
        if (auto st = run_transfers(in, pacer); !st.ok()) return st;
      }
      if (ring.next() != t.peer) {
        std::vector<Transfer> out{Transfer{c.peers[ring.next()], true, static_cast<char*>(t.recv), bytes, 0}};
        if (auto st = run_transfers(out, pacer); !st.ok()) return st;
      }
      return {};
    }
    case Coll::kSend:
    case Coll::kRecv:
      return {};  // p2p runs in run_p2p, all of a launch's together
  }
  return {};
}

Status run_p2p(std::vector<Task>& tasks, Pacer& pacer) {
  std::vector<Transfer> transfers;
  for (Task& t : tasks) {
    if (t.coll != Coll::kSend && t.coll != Coll::kRecv) continue;
    size_t bytes = t.count * type_size(t.type);
    if (t.peer == t.comm->rank) continue;  // self send/recv pairs: copied below
    bool send = t.coll == Coll::kSend;
    char* buf = send ? static_cast<char*>(const_cast<void*>(t.send)) : static_cast<char*>(t.recv);
    transfers.push_back(Transfer{t.comm->peers[t.peer], send, buf, bytes, 0});
  }
  // A send to self pairs with a receive from self, in order.
  std::vector<Task*> self_sends, self_recvs;
  for (Task& t : tasks) {
    if (t.coll == Coll::kSend && t.peer == t.comm->rank) self_sends.push_back(&t);
    if (t.coll == Coll::kRecv && t.peer == t.comm->rank) self_recvs.push_back(&t);
  }
  for (size_t i = 0; i < std::min(self_sends.size(), self_recvs.size()); ++i) {
    size_t bytes = self_recvs[i]->count * type_size(self_recvs[i]->type);
    if (bytes > 0) std::memmove(self_recvs[i]->recv, self_sends[i]->send, bytes);
  }
  return run_transfers(transfers, pacer);
}

// One launch: the work of one stream in one call or one group, run by the stream's worker.
struct Launch {
  std::vector<Task> tasks;
  int device = 0;
};

int run_launch(void* user) {
  std::unique_ptr<Launch> launch(static_cast<Launch*>(user));
  uint64_t rate = 0;
  if (strata_gpu_state* gs = map_gpu_state(); gs != nullptr && launch->device >= 0 &&
                                               launch->device < static_cast<int>(STRATA_GPU_STATE_MAX_DEVICES)) {
    rate = std::atomic_ref<uint64_t>(gs->dev[launch->device].net_rate_bps).load(std::memory_order_relaxed);
  }
  Pacer pacer(rate);
  for (Task& t : launch->tasks) {
    if (t.comm->async_error.load() != ncclSuccess) return 1;  // a broken communicator stays broken
    if (auto st = run_task(t, pacer); !st.ok()) {
      t.comm->fail(std::string(coll_name(t.coll)) + " failed: " + st.error().message);
      return 1;
    }
  }
  if (auto st = run_p2p(launch->tasks, pacer); !st.ok()) {
    launch->tasks.front().comm->fail("Send/Recv failed: " + st.error().message);
    return 1;
  }
  return 0;
}

// ---- groups ------------------------------------------------------------------------------------
thread_local int t_group_depth = 0;
thread_local std::vector<Task> t_group_tasks;
thread_local std::string t_last_error;

ncclResult_t launch_tasks(std::vector<Task> tasks) {
  // One launch per stream, in the order streams first appear.
  while (!tasks.empty()) {
    cudaStream_t stream = tasks.front().stream;
    auto launch = std::make_unique<Launch>();
    std::vector<Task> rest;
    for (Task& t : tasks) (t.stream == stream ? launch->tasks : rest).push_back(std::move(t));
    tasks = std::move(rest);
    uint64_t bytes = 0;
    bool all_p2p = true;
    const Task* first_coll = nullptr;
    for (const Task& t : launch->tasks) {
      bytes += payload_bytes(t);
      if (t.coll != Coll::kSend && t.coll != Coll::kRecv) {
        all_p2p = false;
        if (first_coll == nullptr) first_coll = &t;
      }
    }
    const void* stub = all_p2p ? reinterpret_cast<const void*>(&ncclDevKernel_SendRecv) : stub_for(*first_coll);
    launch->device = strataTestbedStreamDevice(stream);
    Launch* raw = launch.release();  // run_launch owns it from here
    if (strataTestbedLaunchDeviceFn(stream, stub, bytes, run_launch, raw) != cudaSuccess) {
      delete raw;
      t_last_error = "invalid stream";
      return ncclUnhandledCudaError;
    }
  }
  return ncclSuccess;
}

ncclResult_t enqueue(Task t, ncclComm_t comm, cudaStream_t stream) {
  if (comm == nullptr || comm->state == nullptr) {
    t_last_error = "invalid communicator";
    return ncclInvalidArgument;
  }
  if (type_size(t.type) == 0 || (t.op < 0 || t.op > ncclAvg)) {
    t_last_error = "invalid datatype or reduction op";
    return ncclInvalidArgument;
  }
  if (t.count > 0 && ((t.coll != Coll::kRecv && t.send == nullptr) || (t.coll != Coll::kSend && t.recv == nullptr))) {
    t_last_error = "null buffer";
    return ncclInvalidArgument;
  }
  if ((t.coll == Coll::kBroadcast || t.coll == Coll::kReduce || t.coll == Coll::kSend || t.coll == Coll::kRecv) &&
      (t.peer < 0 || t.peer >= comm->state->nranks)) {
    t_last_error = "invalid root or peer rank";
    return ncclInvalidArgument;
  }
  if (ncclResult_t e = static_cast<ncclResult_t>(comm->state->async_error.load()); e != ncclSuccess) return e;
  t.comm = comm->state;
  t.stream = stream;
  if (t_group_depth > 0) {
    t_group_tasks.push_back(std::move(t));
    return ncclSuccess;
  }
  std::vector<Task> one;
  one.push_back(std::move(t));
  return launch_tasks(std::move(one));
}

ncclResult_t init_rank(ncclComm_t* out, int nranks, const ncclUniqueId& id, int rank) {
  if (out == nullptr || nranks < 1 || rank < 0 || rank >= nranks) {
    t_last_error = "invalid nranks or rank";
    return ncclInvalidArgument;
  }
  IdPayload payload{};
  std::memcpy(&payload, id.internal, sizeof(payload));
  if (payload.magic != kIdMagic) {
    t_last_error = "ncclUniqueId was not made by ncclGetUniqueId";
    return ncclInvalidArgument;
  }
  auto state = std::make_shared<CommState>();
  state->rank = rank;
  state->nranks = nranks;
  cudaGetDevice(&state->device);
  state->hash = payload.nonce;
  state->peers.assign(static_cast<size_t>(nranks), -1);

  auto fail = [&](const std::string& what) {
    t_last_error = "ncclCommInitRank rank " + std::to_string(rank) + ": " + what;
    std::fprintf(stderr, "testbed nccl: %s\n", t_last_error.c_str());
    return ncclSystemError;
  };
  auto listener = listen_any();
  if (!listener.ok()) return fail(listener.error().message);
  auto root = connect_to(payload.ip_be, payload.port_be);
  if (!root.ok()) {
    ::close(listener->fd);
    return fail("bootstrap: " + root.error().message);
  }
  Hello hello{kIdMagic, rank, nranks, htons(listener->port), 0};
  std::vector<PeerAddr> table(static_cast<size_t>(nranks));
  Status st = send_all(*root, &hello, sizeof(hello));
  if (st.ok()) st = recv_all(*root, table.data(), table.size() * sizeof(PeerAddr));
  ::close(*root);
  if (!st.ok()) {
    ::close(listener->fd);
    return fail("bootstrap: " + st.error().message);
  }
  // Full mesh: connect to every lower rank, accept every higher one (the backlog holds them).
  for (int p = 0; p < rank && st.ok(); ++p) {
    auto fd = connect_to(table[p].ip_be, table[p].port_be);
    if (!fd.ok()) {
      st = fd.error();
      break;
    }
    state->peers[p] = *fd;
    int32_t me = rank;
    st = send_all(*fd, &me, sizeof(me));
  }
  for (int k = rank + 1; k < nranks && st.ok(); ++k) {
    auto fd = accept_one(listener->fd);
    if (!fd.ok()) {
      st = fd.error();
      break;
    }
    int32_t who = -1;
    st = recv_all(*fd, &who, sizeof(who));
    if (st.ok() && (who <= rank || who >= nranks || state->peers[who] >= 0)) st = Error{"bad peer handshake"};
    if (!st.ok()) {
      ::close(*fd);
      break;
    }
    state->peers[who] = *fd;
  }
  ::close(listener->fd);
  if (!st.ok()) return fail("connecting peers: " + st.error().message);
  auto* comm = new ncclComm;
  comm->state = std::move(state);
  *out = comm;
  return ncclSuccess;
}

}  // namespace
}  // namespace testbed::nccl

using namespace testbed::nccl;

// Exports nccl<Name> as a weak alias of pnccl<Name>, as the real library does.
#define NCCL_ALIAS(name) \
  extern "C" TESTBED_EXPORT decltype(p##name) name __attribute__((weak, alias("p" #name)));

extern "C" {

TESTBED_EXPORT ncclResult_t pncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

TESTBED_EXPORT ncclResult_t pncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (uniqueId == nullptr) return ncclInvalidArgument;
  auto listener = listen_any();
  if (!listener.ok()) {
    t_last_error = "ncclGetUniqueId: " + listener.error().message;
    return ncclSystemError;
  }
  std::thread(bootstrap_root, listener->fd).detach();
  IdPayload payload{};
  payload.magic = kIdMagic;
  payload.version = NCCL_VERSION_CODE;
  payload.ip_be = bootstrap_ip();
  payload.port_be = htons(listener->port);
  std::random_device rd;
  payload.nonce = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(::getpid());
  std::memset(uniqueId->internal, 0, sizeof(uniqueId->internal));
  std::memcpy(uniqueId->internal, &payload, sizeof(payload));
  return ncclSuccess;
}

TESTBED_EXPORT ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return init_rank(comm, nranks, commId, rank);
}

TESTBED_EXPORT ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                                    int rank, ncclConfig_t* /*config*/) {
  // Config (blocking, CTAs, net name...) changes nothing on the testbed; init is always blocking.
  return init_rank(comm, nranks, commId, rank);
}

// One process, ndev ranks: each rank joins from a thread of its own on its device (init blocks
// until every rank has joined), as NCCL initializes them together.
TESTBED_EXPORT ncclResult_t pncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist) {
  if (comm == nullptr || ndev < 1) {
    t_last_error = "ncclCommInitAll: invalid comm or ndev";
    return ncclInvalidArgument;
  }
  ncclUniqueId id;
  if (ncclResult_t r = pncclGetUniqueId(&id); r != ncclSuccess) return r;
  std::vector<ncclResult_t> results(static_cast<size_t>(ndev), ncclSuccess);
  std::vector<std::string> errors(static_cast<size_t>(ndev));
  std::vector<std::thread> threads;
  for (int i = 0; i < ndev; ++i) {
    threads.emplace_back([&, i] {
      cudaSetDevice(devlist != nullptr ? devlist[i] : i);
      results[static_cast<size_t>(i)] = init_rank(&comm[i], ndev, id, i);
      errors[static_cast<size_t>(i)] = t_last_error;
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < ndev; ++i) {
    if (results[static_cast<size_t>(i)] == ncclSuccess) continue;
    for (int j = 0; j < ndev; ++j) {
      if (results[static_cast<size_t>(j)] == ncclSuccess) delete comm[j];
      comm[j] = nullptr;
    }
    t_last_error = errors[static_cast<size_t>(i)];
    return results[static_cast<size_t>(i)];
  }
  return ncclSuccess;
}

// Collective over the parent: every rank tells every other its (color, key) over the parent's
// sockets; the members of a color, ordered by (key, parent rank) as NCCL orders them, get a fresh
// id from their first member and initialize a communicator of their own. NCCL_SPLIT_NOCOLOR:
// no communicator (*newcomm = NULL). The parent must have no work in flight (its sockets carry
// the exchange): callers synchronize before splitting, as torch does.
TESTBED_EXPORT ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                           ncclConfig_t* /*config*/) {
  if (comm == nullptr || comm->state == nullptr || newcomm == nullptr || (color < 0 && color != NCCL_SPLIT_NOCOLOR)) {
    t_last_error = "ncclCommSplit: invalid comm, color or newcomm";
    return ncclInvalidArgument;
  }
  CommState& parent = *comm->state;
  struct Vote {
    int32_t color, key;
  };
  const size_t n = static_cast<size_t>(parent.nranks);
  std::vector<Vote> votes(n);
  votes[static_cast<size_t>(parent.rank)] = {color, key};
  std::vector<Transfer> xfer;
  for (size_t p = 0; p < n; ++p) {
    if (static_cast<int>(p) == parent.rank) continue;
    xfer.push_back(Transfer{parent.peers[p], true, reinterpret_cast<char*>(&votes[static_cast<size_t>(parent.rank)]),
                            sizeof(Vote), 0});
    xfer.push_back(Transfer{parent.peers[p], false, reinterpret_cast<char*>(&votes[p]), sizeof(Vote), 0});
  }
  Pacer unpaced(0);
  if (auto st = run_transfers(xfer, unpaced); !st.ok()) {
    t_last_error = "ncclCommSplit: exchanging colors: " + st.error().message;
    return ncclSystemError;
  }
  *newcomm = nullptr;
  if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
  std::vector<int> members;
  for (size_t p = 0; p < n; ++p) {
    if (votes[p].color == color) members.push_back(static_cast<int>(p));
  }
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return votes[static_cast<size_t>(a)].key < votes[static_cast<size_t>(b)].key; });
  int my_rank = static_cast<int>(std::find(members.begin(), members.end(), parent.rank) - members.begin());
  ncclUniqueId id{};
  const int leader = members.front();
  if (leader == parent.rank) {
    if (ncclResult_t r = pncclGetUniqueId(&id); r != ncclSuccess) return r;
    std::vector<Transfer> out;
    for (size_t i = 1; i < members.size(); ++i)
      out.push_back(Transfer{parent.peers[static_cast<size_t>(members[i])], true, id.internal, sizeof(id), 0});
    if (auto st = run_transfers(out, unpaced); !st.ok()) {
      t_last_error = "ncclCommSplit: handing out the id: " + st.error().message;
      return ncclSystemError;
    }
  } else {
    std::vector<Transfer> in{Transfer{parent.peers[static_cast<size_t>(leader)], false, id.internal, sizeof(id), 0}};
    if (auto st = run_transfers(in, unpaced); !st.ok()) {
      t_last_error = "ncclCommSplit: receiving the id: " + st.error().message;
      return ncclSystemError;
    }
  }
  return init_rank(newcomm, static_cast<int>(members.size()), id, my_rank);
}

TESTBED_EXPORT ncclResult_t pncclCommFinalize(ncclComm_t comm) {
  return comm == nullptr ? ncclInvalidArgument : ncclSuccess;
}

TESTBED_EXPORT ncclResult_t pncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  delete comm;  // sockets close when the last enqueued work lets go of the state
  return ncclSuccess;
}

TESTBED_EXPORT ncclResult_t pncclCommAbort(ncclComm_t comm) { return pncclCommDestroy(comm); }

TESTBED_EXPORT const char* pncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

TESTBED_EXPORT const char* pncclGetLastError(ncclComm_t comm) {
  if (comm != nullptr && comm->state != nullptr) {
    std::lock_guard lock(comm->state->m);
    if (!comm->state->last_error.empty()) {
      t_last_error = comm->state->last_error;
    }
  }
  return t_last_error.c_str();
}

TESTBED_EXPORT ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (comm == nullptr || asyncError == nullptr) return ncclInvalidArgument;
  *asyncError = static_cast<ncclResult_t>(comm->state->async_error.load());
  return ncclSuccess;
}

TESTBED_EXPORT ncclResult_t pncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) return ncclInvalidArgument;
  *count = comm->state->nranks;
  return ncclSuccess;
}

TESTBED_EXPORT ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (comm == nullptr || device == nullptr) return ncclInvalidArgument;
  *device = comm->state->device;
  return ncclSuccess;
}

TESTBED_EXPORT ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) return ncclInvalidArgument;
  *rank = comm->state->rank;
  return ncclSuccess;
}

TESTBED_EXPORT ncclResult_t pncclMemAlloc(void** ptr, size_t size) {
  return cudaMalloc(ptr, size) == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
}

TESTBED_EXPORT ncclResult_t pncclMemFree(void* ptr) {
  return cudaFree(ptr) == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
}

TESTBED_EXPORT ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                           cudaStream_t stream) {
  Task t;
  t.coll = Coll::kAllReduce;
  t.send = sendbuff;
  t.recv = recvbuff;
  t.count = count;
  t.type = datatype;
  t.op = op;
  return enqueue(std::move(t), comm, stream);
}

TESTBED_EXPORT ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                                        ncclDataType_t datatype, ncclRedOp_t op, int root,
                                        ncclComm_t comm, cudaStream_t stream) {
  Task t;
  t.coll = Coll::kReduce;
  t.send = sendbuff;
  t.recv = recvbuff;
  t.count = count;
  t.type = datatype;
  t.op = op;
  t.peer = root;
  // Only the root needs a receive buffer.
  if (comm != nullptr && comm->state != nullptr && comm->state->rank != root && recvbuff == nullptr) {
    t.recv = const_cast<void*>(sendbuff);
  }
  return enqueue(std::move(t), comm, stream);
}

TESTBED_EXPORT ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                               cudaStream_t stream) {
  Task t;
  t.coll = Coll::kReduceScatter;
  t.send = sendbuff;
  t.recv = recvbuff;
  t.count = recvcount;
  t.type = datatype;
  t.op = op;
  return enqueue(std::move(t), comm, stream);
}

TESTBED_EXPORT ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  Task t;
  t.coll = Coll::kAllGather;
  t.send = sendbuff;
  t.recv = recvbuff;
  t.count = sendcount;
  t.type = datatype;
  return enqueue(std::move(t), comm, stream);
}

TESTBED_EXPORT ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                           ncclDataType_t datatype, int root, ncclComm_t comm,
                                           cudaStream_t stream) {
  Task t;
  t.coll = Coll::kBroadcast;
  t.send = sendbuff;
  t.recv = recvbuff;
  t.count = count;
  t.type = datatype;
  t.peer = root;
  return enqueue(std::move(t), comm, stream);
}

TESTBED_EXPORT ncclResult_t pncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                                       ncclComm_t comm, cudaStream_t stream) {
  return pncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

TESTBED_EXPORT ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                                      ncclComm_t comm, cudaStream_t stream) {
  Task t;
  t.coll = Coll::kSend;
  t.send = sendbuff;
  t.count = count;
  t.type = datatype;
  t.peer = peer;
  return enqueue(std::move(t), comm, stream);
}

TESTBED_EXPORT ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                      ncclComm_t comm, cudaStream_t stream) {
  Task t;
  t.coll = Coll::kRecv;
  t.recv = recvbuff;
  t.count = count;
  t.type = datatype;
  t.peer = peer;
  return enqueue(std::move(t), comm, stream);
}

TESTBED_EXPORT ncclResult_t pncclGroupStart() {
  ++t_group_depth;
  return ncclSuccess;
}

TESTBED_EXPORT ncclResult_t pncclGroupEnd() {
  if (t_group_depth == 0) {
    t_last_error = "ncclGroupEnd without ncclGroupStart";
    return ncclInvalidUsage;
  }
  if (--t_group_depth > 0) return ncclSuccess;
  std::vector<Task> tasks = std::move(t_group_tasks);
  t_group_tasks.clear();
  return launch_tasks(std::move(tasks));
}

}  // extern "C"

NCCL_ALIAS(ncclGetVersion)
NCCL_ALIAS(ncclGetUniqueId)
NCCL_ALIAS(ncclCommInitRank)
NCCL_ALIAS(ncclCommInitRankConfig)
NCCL_ALIAS(ncclCommInitAll)
NCCL_ALIAS(ncclCommSplit)
NCCL_ALIAS(ncclCommFinalize)
NCCL_ALIAS(ncclCommDestroy)
NCCL_ALIAS(ncclCommAbort)
NCCL_ALIAS(ncclGetErrorString)
NCCL_ALIAS(ncclGetLastError)
NCCL_ALIAS(ncclCommGetAsyncError)
NCCL_ALIAS(ncclCommCount)
NCCL_ALIAS(ncclCommCuDevice)
NCCL_ALIAS(ncclCommUserRank)
NCCL_ALIAS(ncclMemAlloc)
NCCL_ALIAS(ncclMemFree)
NCCL_ALIAS(ncclAllReduce)
NCCL_ALIAS(ncclReduce)
NCCL_ALIAS(ncclReduceScatter)
NCCL_ALIAS(ncclAllGather)
NCCL_ALIAS(ncclBroadcast)
NCCL_ALIAS(ncclBcast)
NCCL_ALIAS(ncclSend)
NCCL_ALIAS(ncclRecv)
NCCL_ALIAS(ncclGroupStart)
NCCL_ALIAS(ncclGroupEnd)
