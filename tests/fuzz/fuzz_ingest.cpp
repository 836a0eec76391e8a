// The collector's ingest decoder: what any client that can reach `strata serve` POSTs (zstd, then a
// protobuf Batch), then the validation that runs before the store is touched.
#include <cstdint>
#include <string>

#include "proto/ingest_codec.h"
#include "server/ingest_applier.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Small limits: a decompression bomb must be refused at the limit, not allocated.
  strata::ingest::DecodeLimits limits{1u << 20, 8u << 20};
  std::string body(reinterpret_cast<const char*>(data), size);
  auto batch = strata::ingest::decode_batch(body, limits);
  if (batch) (void)strata::server::validate_batch(*batch);
  return 0;
}
