// libnvidia-ml.so.1 stand-in: reports the simulated GPUs of the node from the shared gpu-state
// file (gpu_state.h), including the faults strata-sim injects: a slowed device reports lowered SM
// clocks and its throttle reasons, a hot one a high temperature. Utilization is the busy time the
// libcudart stand-in accumulates, over the interval since the previous query of that device.
// Hardware faults (gpu_state.h's hw_faults): a lost GPU answers GPU_IS_LOST to every device query;
// ECC, PCIe replay and NVLink error counters climb at fixed rates from the fault's start; a degraded
// PCIe link trains at x4 of its x16.
// Events: an Xid the fault injector raised (gpu_state.h's xid, with hw_since_ns telling one raise from
// the next) is delivered once to every event set that registered nvmlEventTypeXidCriticalError for
// the device before it was raised, as the driver does. STRATA_TESTBED_NVML_EVENTS=0 makes the
// registration answer NOT_SUPPORTED (as on boards and containers without event support), so the
// agent's kernel-log fallback can be tested.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "testbed/common/testbed_env.h"
#include "testbed/nvml_abi.h"

#define NVML_EXPORT extern "C" __attribute__((visibility("default")))

// The handle: one per device, owned by the library.
struct nvmlDevice_st {
  unsigned int index = 0;
  std::mutex m;
  uint64_t last_query_ns = 0;  // previous utilization query, for the busy-time delta
  uint64_t last_busy_ns = 0;
  unsigned int last_util = 0;
};

// An event set: per device, the event types registered and the Xid raise last delivered.
struct nvmlEventSet_st {
  std::mutex m;
  unsigned long long types[STRATA_GPU_STATE_MAX_DEVICES] = {};
  uint64_t delivered_since[STRATA_GPU_STATE_MAX_DEVICES] = {};  // hw_since_ns of the last Xid delivered
};

namespace testbed::nvml {
namespace {

constexpr unsigned int kMaxSmClock = 1980;    // MHz (H100 SXM boost)
constexpr unsigned int kMaxMemClock = 2619;   // MHz
constexpr unsigned int kMaxVideoClock = 1755; // MHz
constexpr unsigned long long kMemTotal = 80ull << 30;

std::atomic<int> g_init_count{0};
nvmlDevice_st g_devices[STRATA_GPU_STATE_MAX_DEVICES];

strata_gpu_device_state* state_of(nvmlDevice_t d) {
  strata_gpu_state* s = map_gpu_state();
  if (s == nullptr || d == nullptr) return nullptr;
  return &s->dev[d->index];
}

bool valid(nvmlDevice_t d) {
  if (d == nullptr) return false;
  auto i = static_cast<size_t>(d - g_devices);
  return i < STRATA_GPU_STATE_MAX_DEVICES && d == &g_devices[i];
}

float slowdown_of(strata_gpu_device_state* ds) {
  float f = ds ? std::atomic_ref<float>(ds->slowdown).load(std::memory_order_relaxed) : 1.0f;
  return f > 1.0f ? f : 1.0f;
}

uint32_t hw_of(strata_gpu_device_state* ds) {
  return ds ? std::atomic_ref<uint32_t>(ds->hw_faults).load(std::memory_order_acquire) : 0;
}

// How many errors a fault's counter has climbed to: `per_s` a second since the fault began.
unsigned long long climbed(strata_gpu_device_state* ds, uint32_t bit, double per_s) {
  if (!(hw_of(ds) & bit)) return 0;
  uint64_t since = std::atomic_ref<uint64_t>(ds->hw_since_ns).load(std::memory_order_relaxed);
  uint64_t now = monotonic_ns();
  return now > since ? static_cast<unsigned long long>(static_cast<double>(now - since) / 1e9 * per_s) : 0;
}

// The rates the counters climb at: far above what a healthy board counts (none, or a few a day).
constexpr double kEccUncorrectedPerS = 0.5;
constexpr double kEccCorrectedPerS = 5;
constexpr double kPcieReplaysPerS = 20;
constexpr double kNvlinkErrorsPerS = 10;  // per counter, on link 0
constexpr unsigned int kPcieGen = 5;       // H100 SXM: PCIe Gen5 x16
constexpr unsigned int kPcieMaxWidth = 16;
constexpr unsigned int kPcieDegradedWidth = 4;
constexpr unsigned int kNvLinks = 18;      // H100 SXM: 18 NVLinks

// A degraded link slows the device's transfers, not its SMs: the clocks stay at max.
float sm_slowdown_of(strata_gpu_device_state* ds) {
  return hw_of(ds) & (STRATA_HW_PCIE | STRATA_HW_NVLINK) ? 1.0f : slowdown_of(ds);
}

unsigned long long reasons_of(strata_gpu_device_state* ds) {
  return ds ? std::atomic_ref<uint64_t>(ds->throttle_reasons).load(std::memory_order_relaxed) : 0;
}

unsigned int utilization(nvmlDevice_t d) {
  strata_gpu_device_state* ds = state_of(d);
  uint64_t busy = ds ? std::atomic_ref<uint64_t>(ds->busy_ns).load(std::memory_order_relaxed) : 0;
  uint64_t now = monotonic_ns();
  std::lock_guard lock(d->m);
  // Several streams can be busy at once: clamp to 100%, as NVML's "a kernel was running" does.
  if (d->last_query_ns != 0 && now > d->last_query_ns) {
    uint64_t delta = busy >= d->last_busy_ns ? busy - d->last_busy_ns : 0;
    uint64_t pct = delta * 100 / (now - d->last_query_ns);
    d->last_util = static_cast<unsigned int>(pct > 100 ? 100 : pct);
  }
  d->last_query_ns = now;
  d->last_busy_ns = busy;
  return d->last_util;
}

}  // namespace
}  // namespace testbed::nvml

using namespace testbed::nvml;

#define REQUIRE_INIT() \
  if (g_init_count.load() <= 0) return NVML_ERROR_UNINITIALIZED
#define REQUIRE_DEVICE(d)                      \
  REQUIRE_INIT();                              \
  if (!valid(d)) return NVML_ERROR_INVALID_ARGUMENT; \
  if (hw_of(state_of(d)) & STRATA_HW_LOST) return NVML_ERROR_GPU_IS_LOST

NVML_EXPORT nvmlReturn_t nvmlInit_v2(void) {
  if (testbed::map_gpu_state() == nullptr) return NVML_ERROR_DRIVER_NOT_LOADED;
  for (unsigned i = 0; i < STRATA_GPU_STATE_MAX_DEVICES; ++i) g_devices[i].index = i;
  g_init_count.fetch_add(1);
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }

NVML_EXPORT nvmlReturn_t nvmlShutdown(void) {
  REQUIRE_INIT();
  g_init_count.fetch_sub(1);
  return NVML_SUCCESS;
}

NVML_EXPORT const char* nvmlErrorString(nvmlReturn_t result) {
  switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
  }
}

NVML_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned int length) {
  REQUIRE_INIT();
  if (version == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  const char* v = "580.95.05";  // a driver that carries CUDA 13.0
  if (length < std::strlen(v) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
  std::strcpy(version, v);
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* deviceCount) {
  REQUIRE_INIT();
  if (deviceCount == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *deviceCount = testbed::map_gpu_state()->num_devices;
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int* deviceCount) {
  return nvmlDeviceGetCount_v2(deviceCount);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  REQUIRE_INIT();
  if (device == nullptr || index >= testbed::map_gpu_state()->num_devices) return NVML_ERROR_INVALID_ARGUMENT;
  *device = &g_devices[index];
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t* device) {
  return nvmlDeviceGetHandleByIndex_v2(index, device);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int* index) {
  REQUIRE_DEVICE(device);
  if (index == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *index = device->index;
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char* name, unsigned int length) {
  REQUIRE_DEVICE(device);
  if (name == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  const char* n = "NVIDIA H100 80GB HBM3 (strata testbed)";
  if (length < std::strlen(n) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
  std::strcpy(name, n);
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned int length) {
  REQUIRE_DEVICE(device);
  if (uuid == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  char buf[NVML_DEVICE_UUID_BUFFER_SIZE];
  std::snprintf(buf, sizeof(buf), "GPU-5747b5a1-7e57-4bed-8000-%012x", device->index);
  if (length < std::strlen(buf) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
  std::strcpy(uuid, buf);
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                                   unsigned int* clock) {
  REQUIRE_DEVICE(device);
  if (clock == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  switch (type) {
    case NVML_CLOCK_GRAPHICS:
    case NVML_CLOCK_SM: *clock = kMaxSmClock; return NVML_SUCCESS;
    case NVML_CLOCK_MEM: *clock = kMaxMemClock; return NVML_SUCCESS;
    case NVML_CLOCK_VIDEO: *clock = kMaxVideoClock; return NVML_SUCCESS;
    default: return NVML_ERROR_INVALID_ARGUMENT;
  }
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                                unsigned int* clock) {
  nvmlReturn_t r = nvmlDeviceGetMaxClockInfo(device, type, clock);
  if (r != NVML_SUCCESS) return r;
  // A slowed device runs its SMs at max/slowdown: the clock drop is what the agent sees.
  if (type == NVML_CLOCK_SM || type == NVML_CLOCK_GRAPHICS) {
    *clock = static_cast<unsigned int>(static_cast<float>(*clock) / sm_slowdown_of(state_of(device)));
  }
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType,
                                                  unsigned int* temp) {
  REQUIRE_DEVICE(device);
  if (temp == nullptr || sensorType != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
  unsigned long long reasons = reasons_of(state_of(device));
  bool thermal = reasons & (nvmlClocksThrottleReasonHwThermalSlowdown | nvmlClocksEventReasonSwThermalSlowdown);
  *temp = thermal ? 89 : 46 + device->last_util / 5;
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int* power) {
  REQUIRE_DEVICE(device);
  if (power == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  // Idle 90 W up to 700 W at full use; a slowed device draws less.
  *power = static_cast<unsigned int>((90'000 + device->last_util * 6'100) / sm_slowdown_of(state_of(device)));
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t* u) {
  REQUIRE_DEVICE(device);
  if (u == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  u->gpu = utilization(device);
  u->memory = u->gpu / 3;
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  REQUIRE_DEVICE(device);
  if (memory == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  strata_gpu_device_state* ds = state_of(device);
  unsigned long long used = ds ? std::atomic_ref<uint64_t>(ds->mem_used).load(std::memory_order_relaxed) : 0;
  used += 512ull << 20;  // the driver's own reservation
  if (used > kMemTotal) used = kMemTotal;
  memory->total = kMemTotal;
  memory->used = used;
  memory->free = kMemTotal - used;
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                                unsigned long long* reasons) {
  REQUIRE_DEVICE(device);
  if (reasons == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *reasons = reasons_of(state_of(device));
  if (*reasons == 0 && device->last_util == 0) *reasons = nvmlClocksEventReasonGpuIdle;
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                                   unsigned long long* reasons) {
  return nvmlDeviceGetCurrentClocksEventReasons(device, reasons);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                                     nvmlEccCounterType_t counterType, unsigned long long* eccCounts) {
  REQUIRE_DEVICE(device);
  if (eccCounts == nullptr || errorType >= NVML_MEMORY_ERROR_TYPE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
  (void)counterType;  // volatile and aggregate count alike here: the node's driver was loaded with the run
  bool unc = errorType == NVML_MEMORY_ERROR_TYPE_UNCORRECTED;
  *eccCounts = climbed(state_of(device), STRATA_HW_ECC, unc ? kEccUncorrectedPerS : kEccCorrectedPerS);
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int* value) {
  REQUIRE_DEVICE(device);
  if (value == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *value = static_cast<unsigned int>(climbed(state_of(device), STRATA_HW_PCIE, kPcieReplaysPerS));
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int* currLinkGen) {
  REQUIRE_DEVICE(device);
  if (currLinkGen == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *currLinkGen = kPcieGen;
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int* currLinkWidth) {
  REQUIRE_DEVICE(device);
  if (currLinkWidth == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *currLinkWidth = hw_of(state_of(device)) & STRATA_HW_PCIE ? kPcieDegradedWidth : kPcieMaxWidth;
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int* maxLinkWidth) {
  REQUIRE_DEVICE(device);
  if (maxLinkWidth == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *maxLinkWidth = kPcieMaxWidth;
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t* isActive) {
  REQUIRE_DEVICE(device);
  if (isActive == nullptr || link >= kNvLinks) return NVML_ERROR_INVALID_ARGUMENT;
  *isActive = NVML_FEATURE_ENABLED;
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link,
                                                         nvmlNvLinkErrorCounter_t counter,
                                                         unsigned long long* counterValue) {
  REQUIRE_DEVICE(device);
  if (counterValue == nullptr || link >= kNvLinks || counter >= NVML_NVLINK_ERROR_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
  // The failing link is link 0; its replays and CRC errors climb, the other links count none.
  bool counts = link == 0 && (counter == NVML_NVLINK_ERROR_DL_REPLAY || counter == NVML_NVLINK_ERROR_DL_CRC_FLIT);
  *counterValue = counts ? climbed(state_of(device), STRATA_HW_NVLINK, kNvlinkErrorsPerS) : 0;
  return NVML_SUCCESS;
}

// PCI identity: domain 0, one bus per device (an HGX board's GPUs sit on separate buses), so a
// kernel-log Xid "(PCI:0000:BB:00)" names exactly one device.
constexpr unsigned int kPciBusBase = 0x18;
constexpr unsigned int kPciBusStride = 0x0c;
constexpr unsigned int kPciDeviceId = 0x233010de;  // H100 SXM5 (device 0x2330, vendor NVIDIA 0x10de)

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t* pci) {
  REQUIRE_DEVICE(device);
  if (pci == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  std::memset(pci, 0, sizeof(*pci));
  pci->domain = 0;
  pci->bus = kPciBusBase + device->index * kPciBusStride;
  pci->device = 0;
  pci->pciDeviceId = kPciDeviceId;
  std::snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.0", pci->domain, pci->bus, pci->device);
  std::snprintf(pci->busId, sizeof(pci->busId), "%08X:%02X:%02X.0", pci->domain, pci->bus, pci->device);
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t* pci) {
  return nvmlDeviceGetPciInfo_v3(device, pci);
}

namespace testbed::nvml {
namespace {
bool events_supported() {
  const char* e = std::getenv("STRATA_TESTBED_NVML_EVENTS");
  return !(e && std::strcmp(e, "0") == 0);
}
// The event types the stand-in can deliver.
constexpr unsigned long long kSupportedEvents = nvmlEventTypeXidCriticalError;
// How often a waiting nvmlEventSetWait_v2 looks at the shared state. The real call blocks in the
// driver and wakes once per event or timeout; each look here is a wake-up of the caller's thread
// (~40-100 us of CPU in this VM, billed to the agent that called it: at 20 ms it was 14% of the
// agent's CPU on the sim), so it looks once a second (the agent waits 1 s a round: one look per
// round, as the real call wakes once); an Xid is seen within a second.
constexpr auto kEventPoll = std::chrono::milliseconds(1000);
}  // namespace
}  // namespace testbed::nvml

NVML_EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long* eventTypes) {
  REQUIRE_DEVICE(device);
  if (eventTypes == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *eventTypes = events_supported() ? kSupportedEvents : 0;
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t* set) {
  REQUIRE_INIT();
  if (set == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *set = new nvmlEventSet_st();
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set) {
  REQUIRE_DEVICE(device);
  if (set == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (!events_supported() || (eventTypes & ~kSupportedEvents) != 0) return NVML_ERROR_NOT_SUPPORTED;
  strata_gpu_device_state* ds = state_of(device);
  std::lock_guard lock(set->m);
  set->types[device->index] |= eventTypes;
  // An Xid raised before the registration is not an event of this set.
  if (ds && std::atomic_ref<uint32_t>(ds->xid).load(std::memory_order_acquire) != 0)
    set->delivered_since[device->index] = std::atomic_ref<uint64_t>(ds->hw_since_ns).load(std::memory_order_relaxed);
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t* data, unsigned int timeoutms) {
  REQUIRE_INIT();
  if (set == nullptr || data == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  strata_gpu_state* gs = testbed::map_gpu_state();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutms);
  for (;;) {
    {
      std::lock_guard lock(set->m);
      for (unsigned i = 0; gs != nullptr && i < gs->num_devices && i < STRATA_GPU_STATE_MAX_DEVICES; ++i) {
        if (!(set->types[i] & nvmlEventTypeXidCriticalError)) continue;
        strata_gpu_device_state& ds = gs->dev[i];
        // The injector writes since_ns and xid, then the fault bits (release).
        if (std::atomic_ref<uint32_t>(ds.hw_faults).load(std::memory_order_acquire) == 0) continue;
        uint32_t xid = std::atomic_ref<uint32_t>(ds.xid).load(std::memory_order_relaxed);
        uint64_t since = std::atomic_ref<uint64_t>(ds.hw_since_ns).load(std::memory_order_relaxed);
        if (xid == 0 || since == set->delivered_since[i]) continue;
        set->delivered_since[i] = since;
        std::memset(data, 0, sizeof(*data));
        data->device = &g_devices[i];
        data->eventType = nvmlEventTypeXidCriticalError;
        data->eventData = xid;
        data->gpuInstanceId = 0xFFFFFFFFu;  // not MIG
        data->computeInstanceId = 0xFFFFFFFFu;
        return NVML_SUCCESS;
      }
    }
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return NVML_ERROR_TIMEOUT;
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(kEventPoll, deadline - now));
  }
}

NVML_EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
  REQUIRE_INIT();
  if (set == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  delete set;
  return NVML_SUCCESS;
}
