// strata-ingest-bench STORE_SPEC [BATCHES] [ROWS_PER_BATCH]: the collector's ingest cost per core.
// Builds realistic batches (stack counts, metrics, collectives, steps, stacks defined once), then
// decodes, validates and applies them on one thread as `strata serve` does for each POST, and
// prints records/s (HTTP transport aside: one request per batch of thousands of rows).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "proto/ingest_codec.h"
#include "server/ingest_applier.h"
#include "server/server.h"

using namespace strata;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: strata-ingest-bench STORE_SPEC [BATCHES] [ROWS_PER_BATCH]\n";
    return 1;
  }
  int batches = argc > 2 ? std::atoi(argv[2]) : 50;
  int rows = argc > 3 ? std::atoi(argv[3]) : 20000;
  auto store = server::open_store(argv[1], store::Store::Mode::kCreateOrAppend);
  if (!store) {
    std::cerr << "strata-ingest-bench: " << store.error().message << "\n";
    return 2;
  }
  std::vector<std::string> bodies;
  uint64_t records = 0;
  std::string agent = "bench-" + std::to_string(std::chrono::system_clock::now().time_since_epoch().count());
  uint64_t t0 = 1'700'000'000'000'000'000ull;
  for (int b = 0; b < batches; ++b) {
    ingest::Batch batch;
    batch.set_schema_version(ingest::kIngestVersion);
    batch.set_agent_id(agent);
    batch.set_node("bench");
    batch.set_batch_id(static_cast<uint64_t>(b + 1));
    if (b == 0) {
      auto* r = batch.add_records()->mutable_recording();
      r->set_local_id(1);
      r->set_node("bench");
      r->set_started_ns(t0);
      for (int s = 0; s < 200; ++s) {  // stacks: sent once per agent
        auto* d = batch.add_records()->mutable_stack();
        d->set_local_id(s + 1);
        for (int f = 0; f < 24; ++f) {
          auto* fr = d->add_frames();
          fr->set_module("/usr/lib/libtorch_cpu.so");
          fr->set_build_id("0123456789abcdef0123456789abcdef01234567");
          fr->set_offset(static_cast<uint64_t>(s * 1000 + f * 16));
          fr->set_function("at::native::fn" + std::to_string(f));
        }
      }
    }
    uint64_t ws = t0 + static_cast<uint64_t>(b) * 10'000'000'000ull;
    int quarter = rows / 4;
    auto* w = batch.add_records()->mutable_window();
    w->set_recording(1);
    w->set_start_ns(ws);
    w->set_end_ns(ws + 10'000'000'000ull);
    for (int i = 0; i < quarter; ++i) {
      auto* c = w->add_counts();
      c->set_pid(1000 + static_cast<uint32_t>(i % 8));
      c->set_tid(2000 + static_cast<uint32_t>(i % 64));
      c->set_thread_comm("python3");
      c->set_stack(1 + i % 200);
      c->set_value(1 + static_cast<uint64_t>(i % 7));
    }
    auto* m = batch.add_records()->mutable_metrics();
    m->set_recording(1);
    m->set_start_ns(ws);
    m->set_end_ns(ws + 10'000'000'000ull);
    for (int i = 0; i < quarter; ++i) {
      auto* x = m->add_metrics();
      x->set_pid(1000 + static_cast<uint32_t>(i % 8));
      x->set_name("os.runq_latency_us");
      x->set_label("p" + std::to_string(i % 100));
      x->set_value(i * 0.5);
    }
    auto* co = batch.add_records()->mutable_collectives();
    co->set_recording(1);
    for (int i = 0; i < quarter; ++i) {
      auto* c = co->add_rows();
      c->set_pid(1000 + static_cast<uint32_t>(i % 8));
      c->set_library("nccl");
      c->set_op("allreduce");
      c->set_comm_id("c0ffee");
      c->set_seq(static_cast<uint64_t>(i));
      c->set_bytes(1 << 20);
      c->set_enter_ns(ws + static_cast<uint64_t>(i) * 1000);
      c->set_exit_ns(ws + static_cast<uint64_t>(i) * 1000 + 500);
      c->set_completion("sync");
    }
    auto* st = batch.add_records()->mutable_steps();
    st->set_recording(1);
    for (int i = 0; i < quarter; ++i) {
      auto* s = st->add_rows();
      s->set_pid(1000 + static_cast<uint32_t>(i % 8));
      s->set_step(static_cast<uint64_t>(b * quarter + i));
      s->set_start_ns(ws + static_cast<uint64_t>(i) * 1000);
      s->set_end_ns(ws + static_cast<uint64_t>(i) * 1000 + 900);
    }
    records += static_cast<uint64_t>(4 * quarter);
    auto body = ingest::encode_batch(batch);
    if (!body) return 2;
    bodies.push_back(std::move(*body));
  }
  server::IngestApplier applier(**store);
  auto start = std::chrono::steady_clock::now();
  std::clock_t c0 = std::clock();
  for (const auto& body : bodies) {
    auto b = ingest::decode_batch(body);
    if (!b) return 2;
    if (auto v = server::validate_batch(*b); !v) return 2;
    auto out = applier.apply(*b, "{}", 1);
    if (!out) {
      std::cerr << "strata-ingest-bench: " << out.error().message << "\n";
      return 2;
    }
  }
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double cpu = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
  std::printf("store=%s records=%llu wall_s=%.3f server_cpu_s=%.3f records_per_s=%.0f records_per_cpu_s=%.0f\n",
              argv[1], static_cast<unsigned long long>(records), wall, cpu, static_cast<double>(records) / wall,
              static_cast<double>(records) / cpu);
  return 0;
}
