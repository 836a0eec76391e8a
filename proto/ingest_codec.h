// The ingest envelope shared by `strata agent` (encode) and `strata serve` (decode): a serialized
// ingest.Batch, zstd-compressed. Decoding is bounded: hostile input costs at most the limits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/result.h"
#include "ingest.pb.h"

namespace strata::ingest {

// The batch format this build writes and the newest it reads (Batch.schema_version).
inline constexpr uint32_t kIngestVersion = 1;

struct DecodeLimits {
  size_t max_compressed = 32u << 20;     // bytes on the wire
  size_t max_decompressed = 256u << 20;  // bytes after zstd
};

// Serializes and compresses; level 3 is zstd's default (fast, ~4x on batches).
Result<std::string> encode_batch(const Batch& batch, int level = 3);

// Decompresses within the limits and parses; checks the version and the envelope's fields.
// Errors are one line, meant for the HTTP 4xx reply.
Result<Batch> decode_batch(const std::string& body, const DecodeLimits& limits = {});

}  // namespace strata::ingest
