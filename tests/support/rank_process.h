// The recorded process of one rank of a one-node PyTorch job ("ddp", node n0, python3 train.py):
// what the store tests that write a job by hand put for each rank.
#pragma once

#include <cstdint>

#include "store/store.h"

namespace strata::test {

inline store::ProcessInfo rank_process(uint32_t pid, int rank, int world_size, uint64_t start_ns) {
  store::ProcessInfo p;
  p.pid = pid;
  p.ppid = 1;
  p.start_ns = start_ns;
  p.node = "n0";
  p.comm = "python3";
  p.command = "python3 train.py";
  p.job = "ddp";
  p.rank = rank;
  p.local_rank = rank;
  p.world_size = world_size;
  return p;
}

}  // namespace strata::test
