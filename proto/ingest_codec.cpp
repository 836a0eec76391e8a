#include "proto/ingest_codec.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>
#include <zstd.h>

#include <climits>
#include <memory>

namespace strata::ingest {
namespace {

using google::protobuf::internal::WireFormatLite;

// Per-kind caps, below DecodeLimits::max_rows where an honest agent sends far fewer: steps are one
// per rank per iteration (8 ranks x 100 steps/s x 10 s = 8k), processes one per process on the
// node, stacks bounded by the agent's own dictionary (200k, BatchingWriter's kMaxStacks), and a
// recording begins once per agent start. The rest (stack counts, metrics, frames, collectives,
// device activity, launch samples) may use the whole batch cap.
struct KindCap {
  const char* kind;
  uint64_t cap;  // 0: DecodeLimits::max_rows
};
constexpr KindCap kKindCaps[] = {
    {"recordings", 1'000},   {"recording_ends", 1'000}, {"processes", 100'000}, {"stacks", 200'000},
    {"communicators", 100'000}, {"steps", 100'000},    {"stats", 10'000},
};

// One record kind on the wire: its field in Record and, for a kind that holds rows, the repeated
// field of its rows (0: the record is one row).
struct WireKind {
  int record_field;
  const char* kind;
  int rows_field;
};
constexpr WireKind kWireKinds[] = {
    {Record::kRecordingFieldNumber, "recordings", 0},
    {Record::kRecordingEndFieldNumber, "recording_ends", 0},
    {Record::kProcessFieldNumber, "processes", 0},
    {Record::kStackFieldNumber, "stacks", 0},  // and its frames, counted as "frames"
    {Record::kWindowFieldNumber, "stack_counts", Window::kCountsFieldNumber},
    {Record::kMetricsFieldNumber, "metrics", Metrics::kMetricsFieldNumber},
    {Record::kCommunicatorsFieldNumber, "communicators", Communicators::kRowsFieldNumber},
    {Record::kCollectivesFieldNumber, "collectives", Collectives::kRowsFieldNumber},
    {Record::kDeviceActivityFieldNumber, "device_activity", DeviceActivities::kRowsFieldNumber},
    {Record::kStepsFieldNumber, "steps", Steps::kRowsFieldNumber},
    {Record::kLaunchSamplesFieldNumber, "launch_samples", LaunchSamples::kRowsFieldNumber},
    {Record::kStatFieldNumber, "stats", 0},
};

// Counts the occurrences of field `rows_field` in the message the stream is limited to.
bool count_field(google::protobuf::io::CodedInputStream& in, int rows_field, uint64_t& n) {
  while (uint32_t tag = in.ReadTag()) {
    if (WireFormatLite::GetTagFieldNumber(tag) == rows_field) ++n;
    if (!WireFormatLite::SkipField(&in, tag)) return false;
  }
  return in.ConsumedEntireMessage();
}

bool count_record(google::protobuf::io::CodedInputStream& in, std::map<std::string, uint64_t>& rows) {
  while (uint32_t tag = in.ReadTag()) {
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    const WireKind* k = nullptr;
    for (const auto& w : kWireKinds) {
      if (w.record_field == field) k = &w;
    }
    if (!k || WireFormatLite::GetTagWireType(tag) != WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      if (!WireFormatLite::SkipField(&in, tag)) return false;
      continue;
    }
    uint32_t len = 0;
    if (!in.ReadVarint32(&len)) return false;
    auto limit = in.PushLimit(static_cast<int>(len));
    uint64_t n = 0;
    if (k->rows_field) {
      if (!count_field(in, k->rows_field, n)) return false;
      rows[k->kind] += n;
    } else {
      rows[k->kind] += 1;
      if (field == Record::kStackFieldNumber) {
        if (!count_field(in, StackDef::kFramesFieldNumber, n)) return false;
        rows["frames"] += n;
      } else if (!in.Skip(static_cast<int>(len))) {
        return false;
      }
    }
    in.PopLimit(limit);
  }
  return in.ConsumedEntireMessage();
}

}  // namespace

uint64_t row_cap(const std::string& kind, const DecodeLimits& limits) {
  for (const auto& k : kKindCaps) {
    if (kind == k.kind) return std::min(k.cap, limits.max_rows);
  }
  return limits.max_rows;
}

bool count_rows(const std::string& raw, std::map<std::string, uint64_t>& rows) {
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(raw.data()), static_cast<int>(raw.size()));
  in.SetTotalBytesLimit(INT_MAX);
  while (uint32_t tag = in.ReadTag()) {
    if (WireFormatLite::GetTagFieldNumber(tag) != Batch::kRecordsFieldNumber ||
        WireFormatLite::GetTagWireType(tag) != WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      if (!WireFormatLite::SkipField(&in, tag)) return false;
      continue;
    }
    uint32_t len = 0;
    if (!in.ReadVarint32(&len)) return false;
    auto limit = in.PushLimit(static_cast<int>(len));
    if (!count_record(in, rows)) return false;
    in.PopLimit(limit);
  }
  return in.ConsumedEntireMessage();
}

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
  // Rows are counted before any is built: a batch over a cap is refused at the cost of a scan.
  std::map<std::string, uint64_t> rows;
  if (!count_rows(raw, rows)) return Error{"malformed batch: not a strata.ingest.Batch protobuf"};
  uint64_t total = 0;
  for (const auto& [kind, n] : rows) {
    total += n;
    const uint64_t cap = row_cap(kind, limits);
    if (n > cap)
      return Error{"batch too large: " + std::to_string(n) + " " + kind + " rows, limit " + std::to_string(cap) +
                   " per batch (send smaller batches)"};
  }
  if (total > limits.max_rows)
    return Error{"batch too large: " + std::to_string(total) + " rows, limit " + std::to_string(limits.max_rows) +
                 " per batch (send smaller batches)"};
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
