// The diagnosis of one window at scale: a synthetic job of N ranks (diagnose/synthetic.h) with
// planted faults, timed and measured. Prints one line:
//   ranks=N generate_s=.. diagnose_s=.. peak_rss_mb=.. found=K/P
// Run it through bench/diagnose_scale.sh (one core, one process per size).
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "diagnose/engine.h"
#include "diagnose/synthetic.h"

int main(int argc, char** argv) {
  size_t ranks = 100000;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--ranks") == 0) ranks = std::strtoull(argv[i + 1], nullptr, 10);
  }
  using strata::diagnose::PlantedFault;
  strata::diagnose::SyntheticSpec spec;
  spec.ranks = ranks;
  spec.seed = 7;
  // Faults spread over the job, each on a different layer, with distinct costs so the order is known.
  spec.faults = {PlantedFault{static_cast<int>(ranks * 1 / 7), "gpu-slow", 50},
                 PlantedFault{static_cast<int>(ranks * 3 / 7), "cpu-contention", 35},
                 PlantedFault{static_cast<int>(ranks * 5 / 7), "host-hotspot", 25},
                 PlantedFault{static_cast<int>(ranks * 6 / 7), "io-stall", 15}};
  auto t0 = std::chrono::steady_clock::now();
  auto job = strata::diagnose::make_synthetic_job(spec);
  auto t1 = std::chrono::steady_clock::now();
  auto dx = strata::diagnose::diagnose(job);
  auto t2 = std::chrono::steady_clock::now();
  size_t found = 0;
  for (size_t i = 0; i < spec.faults.size(); ++i) {
    const auto& f = spec.faults[i];
    if (i < dx.findings.size() && dx.findings[i].rank == f.rank && strata::diagnose::cause_name(dx.findings[i].cause) == f.cause &&
        dx.findings[i].culprit.find(strata::diagnose::planted_culprit(f)) != std::string::npos) {
      ++found;
    }
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::printf("ranks=%zu generate_s=%.3f diagnose_s=%.3f peak_rss_mb=%.1f found=%zu/%zu findings=%zu\n", ranks,
              std::chrono::duration<double>(t1 - t0).count(), std::chrono::duration<double>(t2 - t1).count(),
              static_cast<double>(ru.ru_maxrss) / 1024.0, found, spec.faults.size(), dx.findings.size());
  return found == spec.faults.size() && dx.findings.size() == spec.faults.size() ? 0 : 1;
}
