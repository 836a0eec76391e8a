// The ingest envelope shared by `strata agent` (encode) and `strata serve` (decode): a serialized
// ingest.Batch, zstd-compressed. Decoding is bounded: hostile input costs at most the limits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "common/result.h"
#include "ingest.pb.h"

namespace strata::ingest {

// The batch format this build writes and the newest it reads (Batch.schema_version).
inline constexpr uint32_t kIngestVersion = 1;

struct DecodeLimits {
  size_t max_compressed = 32u << 20;     // bytes on the wire
  size_t max_decompressed = 256u << 20;  // bytes after zstd
  // Rows (and stack frames) in one batch, all kinds together; each kind has a cap of its own too
  // (row_cap). Counted on the wire before anything is built: an empty row is 2 bytes of protobuf
  // but ~100-200 bytes once parsed, so 10M of them fit in a 2 KB zstd frame and would cost GBs.
  // An agent seals a batch at 4 MB uncompressed (ShipperOptions::seal_bytes), a few hundred
  // thousand rows at most; 1M leaves room and bounds a parse at ~200 MB.
  uint64_t max_rows = 1'000'000;
};

// The most rows of one kind ("collectives", "frames", ...) a batch may hold under `limits`.
uint64_t row_cap(const std::string& kind, const DecodeLimits& limits);

// Rows per kind in a serialized Batch, counted without building it; false when it is not a
// well-formed protobuf.
bool count_rows(const std::string& raw, std::map<std::string, uint64_t>& rows);

// Serializes and compresses; level 3 is zstd's default (fast, ~4x on batches).
Result<std::string> encode_batch(const Batch& batch, int level = 3);

// Decompresses within the limits and parses; checks the version and the envelope's fields.
// Errors are one line, meant for the HTTP 4xx reply.
Result<Batch> decode_batch(const std::string& body, const DecodeLimits& limits = {});

}  // namespace strata::ingest
