#include "proto/ingest_codec.h"

#include <zstd.h>

#include <memory>

namespace strata::ingest {

Result<std::string> encode_batch(const Batch& batch, int level) {
  std::string raw;
  if (!batch.SerializeToString(&raw)) return Error{"cannot serialize an ingest batch"};
  std::string out(ZSTD_compressBound(raw.size()), '\0');
  size_t n = ZSTD_compress(out.data(), out.size(), raw.data(), raw.size(), level);
  if (ZSTD_isError(n)) return Error{std::string("zstd: ") + ZSTD_getErrorName(n)};
  out.resize(n);
  return out;
}

Result<Batch> decode_batch(const std::string& body, const DecodeLimits& limits) {
  if (body.empty()) return Error{"empty body: expected a zstd-compressed strata.ingest.Batch"};
  if (body.size() > limits.max_compressed)
    return Error{"batch too large: " + std::to_string(body.size()) + " bytes compressed, limit " +
                 std::to_string(limits.max_compressed)};
  // Streaming, so a frame that lies about (or omits) its size still stops at the limit.
  std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> ctx(ZSTD_createDCtx(), ZSTD_freeDCtx);
  if (!ctx) return Error{"out of memory"};
  std::string raw;
  ZSTD_inBuffer in{body.data(), body.size(), 0};
  std::string chunk(ZSTD_DStreamOutSize(), '\0');
  size_t last = 1;
  while (in.pos < in.size) {
    ZSTD_outBuffer out{chunk.data(), chunk.size(), 0};
    last = ZSTD_decompressStream(ctx.get(), &out, &in);
    if (ZSTD_isError(last)) return Error{std::string("not a valid zstd stream: ") + ZSTD_getErrorName(last)};
    if (raw.size() + out.pos > limits.max_decompressed)
      return Error{"batch too large: more than " + std::to_string(limits.max_decompressed) +
                   " bytes decompressed"};
    raw.append(chunk.data(), out.pos);
    if (out.pos == 0 && last != 0 && in.pos == in.size) break;
  }
  // Flush what the decoder still holds (output buffer was full on the last call).
  while (last != 0) {
    ZSTD_inBuffer none{nullptr, 0, 0};
    ZSTD_outBuffer out{chunk.data(), chunk.size(), 0};
    last = ZSTD_decompressStream(ctx.get(), &out, &none);
    if (ZSTD_isError(last)) return Error{std::string("not a valid zstd stream: ") + ZSTD_getErrorName(last)};
    if (raw.size() + out.pos > limits.max_decompressed)
      return Error{"batch too large: more than " + std::to_string(limits.max_decompressed) +
                   " bytes decompressed"};
    raw.append(chunk.data(), out.pos);
    if (out.pos == 0) break;
  }
  if (last != 0) return Error{"truncated zstd stream: the batch ends before its frame does"};
  Batch b;
  if (!b.ParseFromString(raw)) return Error{"malformed batch: not a strata.ingest.Batch protobuf"};
  if (b.schema_version() == 0) return Error{"malformed batch: no schema_version"};
  if (b.schema_version() > kIngestVersion)
    return Error{"batch schema version " + std::to_string(b.schema_version()) + " is newer than this server reads (" +
                 std::to_string(kIngestVersion) + "): upgrade strata serve"};
  if (b.agent_id().empty() || b.agent_id().size() > 256) return Error{"malformed batch: agent_id missing or too long"};
  if (b.node().size() > 256) return Error{"malformed batch: node name too long"};
  if (b.batch_id() == 0) return Error{"malformed batch: batch_id must be 1 or more"};
  return b;
}

}  // namespace strata::ingest
