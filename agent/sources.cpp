#include "agent/sources.h"

#include <sstream>

#include "agent/gpu/nvml_source.h"
#include "agent/gpu/timeline_reader.h"
#include "agent/gpu_comm_source.h"
#include "agent/os/os_source.h"

namespace strata::agent {

const std::vector<std::string>& all_layers() {
  static const std::vector<std::string> layers = {"cpu", "offcpu", "os", "gpu", "comm"};
  return layers;
}

Result<std::set<std::string>> parse_layers(const std::string& spec) {
  std::set<std::string> out;
  std::stringstream ss(spec);
  std::string part;
  while (std::getline(ss, part, ',')) {
    if (part == "all") {
      out.insert(all_layers().begin(), all_layers().end());
      continue;
    }
    bool known = false;
    for (const auto& l : all_layers()) known = known || l == part;
    if (!known) return Error{"--layers: unknown layer '" + part + "' (cpu, offcpu, os, gpu, comm, all)"};
    out.insert(part);
  }
  if (out.empty()) return Error{"--layers: expected a list such as cpu,os,gpu,comm"};
  return out;
}

Sources make_sources(const std::set<std::string>& layers, const SourceEnv& env) {
  Sources s;
  if (layers.count("offcpu") || layers.count("os")) {
    auto src = os::start_os_layer(os::options_from_env(layers.count("offcpu") > 0, layers.count("os") > 0), env);
    if (src) s.sources.push_back(std::move(*src));
    else s.warnings.push_back("off-CPU/OS layers are off: " + src.error().message);
  }
  if (layers.count("gpu") || layers.count("comm")) {
    GpuCommOptions o;
    o.gpu = layers.count("gpu") > 0;
    o.comm = layers.count("comm") > 0;
    if (!env.raw_device_records) o.max_device_records_per_window = 0;
    auto src = start_gpu_comm_source(o, env);
    if (src) s.sources.push_back(std::move(*src));
    else s.warnings.push_back("GPU/communication layers are off: " + src.error().message);
  }
  if (layers.count("gpu")) {
    // The GPU timelines' directory, before the jobs write: a job that is not root can create its
    // timeline only in a directory that root made.
    if (auto st = prepare_timeline_rendezvous(); !st) s.warnings.push_back("GPU device times: " + st.error().message);
    // The node's GPUs through NVML: independent of the probes above, so either can run alone.
    auto nvml = start_nvml_source(NvmlOptions{});
    if (nvml) s.sources.push_back(std::move(*nvml));
    else s.warnings.push_back("GPU metrics (NVML) are off: " + nvml.error().message);
  }
  return s;
}

Sources make_replay_sources(const std::set<std::string>& layers, const SourceEnv& env) {
  Sources s;
  if (layers.count("offcpu") || layers.count("os")) {
    auto src = os::replay_os_layer(os::options_from_env(layers.count("offcpu") > 0, layers.count("os") > 0), env);
    if (src) s.sources.push_back(std::move(*src));
    else s.warnings.push_back("off-CPU/OS layers are off: " + src.error().message);
  }
  if (layers.count("gpu") || layers.count("comm")) {
    GpuCommOptions o;
    o.gpu = layers.count("gpu") > 0;
    o.comm = layers.count("comm") > 0;
    if (!env.raw_device_records) o.max_device_records_per_window = 0;
    s.sources.push_back(replay_gpu_comm_source(o, env));
  }
  if (layers.count("gpu")) s.warnings.push_back("GPU metrics (NVML) are not replayed");
  return s;
}

}  // namespace strata::agent
