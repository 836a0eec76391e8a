// strata's store: one logical schema (DESIGN §5), SQLite embedded by default. Writers intern
// frames and stacks once and add windowed counts; readers load filtered profiles.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/frame.h"
#include "common/result.h"
#include "common/profile.h"

namespace strata::store {

// 2: the collector's tables (ingest_batches, agent_ids, agents); version 1 files are migrated.
// 3: the collector's kept diagnoses (diagnoses, findings); older files are migrated.
inline constexpr int kSchemaVersion = 3;

struct RecordingInfo {
  std::string node;
  std::string command;       // what was recorded: the command line, or "-p PID,..."
  uint64_t started_ns = 0;   // unix ns
  unsigned sample_hz = 0;
  double window_s = 0;
};

struct ProcessInfo {
  uint32_t pid = 0;
  uint32_t ppid = 0;
  uint64_t start_ns = 0;  // unix ns; with node and pid, identifies the process
  std::string node;
  std::string comm;
  std::string command;    // full command line, space separated
  std::string job;        // TORCHELASTIC_RUN_ID / STRATA_JOB, else empty
  int rank = -1;
  int local_rank = -1;
  int world_size = -1;
  // Where it runs on a Kubernetes / container node (agent/container_identity.h); empty elsewhere.
  std::string pod_uid;
  std::string container_id;  // containerd://<id>, docker://<id>, cri-o://<id>, ...
  std::string pod_name;
  std::string pod_namespace;
};

enum class CountKind : int { kOnCpu = 0, kOffCpu = 1 };

// How a stack's user part was unwound: recorded per stack so reports can say which method
// produced what (DESIGN §4).
enum class UnwindMethod : int {
  kFramePointer = 0,
  kDwarf = 1,      // .eh_frame / .debug_frame CFI
  kMixed = 2,      // frame pointers in some modules, CFI in others
  kKernelOnly = 3,
};
const char* unwind_method_name(UnwindMethod m);

// How a window's on-CPU samples were taken (issue 19): the cost budget (agent/cost_budget.h) lowers
// the rate (99 -> 49 -> 24 Hz) and turns node-side CFI unwinding off when the agent costs too much,
// so one recording holds windows of several fidelities. Counts of a window are samples at its own
// rate: readers weigh each by its period (1/sample_hz), never by the recording's rate.
struct WindowFidelity {
  unsigned sample_hz = 0;  // the rate during this window; 0: not said (older writers): the recording's
  // How user stacks were unwound: kUnwindingCfi, kUnwindingFramePointers, or another short name a
  // later unwinder gives (e.g. per-module adaptive modes); empty: not said (older writers).
  std::string unwinding;
};
inline constexpr const char* kUnwindingCfi = "cfi";            // node-side CFI unwinding on (full)
inline constexpr const char* kUnwindingFramePointers = "fp";   // CFI off: kernel frame-pointer stacks only
// Whether a window's unwinding is below the full one: stacks through code without frame pointers are
// cut short (and so split from the same path unwound whole).
inline bool unwinding_reduced(const std::string& unwinding) { return unwinding == kUnwindingFramePointers; }

// A run of consecutive windows of one recording whose fidelity was below what the recording was
// configured for: a lower rate than its sample_hz, or frame-pointer-only unwinding.
struct ReducedFidelity {
  int64_t recording = 0;
  std::string node;
  uint64_t start_ns = 0, end_ns = 0;  // the first window's start, the last one's end
  uint64_t windows = 0;
  unsigned configured_hz = 0;         // the recording's rate
  unsigned sample_hz = 0;             // the rate in these windows
  std::string unwinding;              // the unwinding in these windows
};

// One on-CPU window's fidelity as stored, and the runs of reduced ones among windows given in
// order per recording (what every store's reduced_fidelity() returns). Consecutive windows (one
// starting where the last ended) of one rate and unwinding make one run; stores may pass the
// reduced windows only.
struct FidelityWindow {
  int64_t recording = 0;
  std::string node;
  uint64_t start_ns = 0, end_ns = 0;
  unsigned configured_hz = 0, sample_hz = 0;
  std::string unwinding;
};
std::vector<ReducedFidelity> reduced_runs(const std::vector<FidelityWindow>& windows);
// One line per run for people (`strata report`): where (node, its ranks among `procs`), when (UTC),
// and what: "node-1 (ranks 0-3), 2026-12-01 18:40:10 - 18:40:40 UTC, 3 windows: 24 Hz instead of
// 99 Hz; frame pointers only (CFI unwinding off)".
std::string describe_reduced_fidelity(const ReducedFidelity& r, const std::vector<ProcessInfo>& procs);

struct StackCount {
  uint32_t pid = 0;
  uint32_t tid = 0;
  std::string thread_comm;
  int64_t stack_id = 0;  // from intern_stack
  uint64_t value = 0;    // samples (on-CPU) or microseconds (off-CPU)
};

// Identity (DESIGN §2, §5): a process is (node, pid, start time); pids repeat across nodes (and
// containers give ranks identical pids), so rows read back carry `node`, the node of the recording
// they came in, and every join of rows to processes uses (node, pid). Writers leave `node` empty:
// a row's node is its recording's.

// A per-window, per-process measurement of some layer (run-queue latency, faults, GPU clock, ...).
// `label` qualifies it where one name has several series (an IRQ vector, a neighbour's comm, a GPU).
struct Metric {
  uint32_t pid = 0;  // 0: the node, not one process
  std::string name;
  std::string label;
  double value = 0;
};

// A communicator a process created (ncclCommInitRank*): the handle is process-local, comm_id (a hash
// of the ncclUniqueId) is the same on every rank of the communicator.
struct CommunicatorRecord {
  uint32_t pid = 0;
  uint64_t handle = 0;
  std::string comm_id;
  int rank = -1;    // rank in the communicator
  int nranks = 0;
  uint64_t init_ns = 0;  // unix ns
  std::string node;      // read back: the recording's node
};

// A call a process was inside at the end of a recording window: entered, not returned (the
// agent reads the probes' calls in flight). Stored as a metric row of that window, name
// kInFlightMetric, label in_flight_label(), value: seconds since the call was entered, at the
// window's end. Collectives (gloo blocks until the collective is done, so a hung one never
// returns and never gets a CollectiveRecord) and the CUDA synchronize calls a host waits for its
// stream in. A later window without the row: the call returned (or the process is gone).
inline constexpr const char* kInFlightMetric = "comm.in_flight_s";
struct InFlightCall {
  std::string library;  // nccl | gloo | cuda (a synchronize)
  std::string op;       // allreduce, ... (collectives); the API's name for a synchronize
  std::string comm_id;  // empty when unknown (gloo: no communicator id is read)
  uint64_t seq = 0;     // the number the call gets when it returns (per communicator; gloo: per op); 0: none
};
// "library|op|comm_id|seq"; parse_in_flight_label returns nullopt for anything else.
std::string in_flight_label(const InFlightCall& c);
std::optional<InFlightCall> parse_in_flight_label(const std::string& label);

// One collective or p2p call. Times are unix ns. `completion` says how the end on the device is
// known: "device" (GPU timing source), "sync" (the stream's next synchronization returned), or
// "none" (only the host call is known).
struct CollectiveRecord {
  uint32_t pid = 0;
  uint32_t tid = 0;
  std::string library;   // nccl | gloo
  std::string op;        // allreduce, allgather, reducescatter, broadcast, reduce, send, recv, barrier
  std::string comm_id;   // empty when unknown
  uint64_t comm_handle = 0;
  uint64_t seq = 0;      // per communicator, from 1
  uint64_t count = 0;
  int dtype = -1;
  uint64_t bytes = 0;
  int redop = -1;
  int peer = -1;         // send/recv peer, broadcast/reduce root
  uint64_t stream = 0;
  uint64_t enter_ns = 0, exit_ns = 0;
  uint64_t device_start_ns = 0, device_end_ns = 0;
  std::string completion = "none";
  int ret = 0;
  std::string node;      // read back: the recording's node
};

// Work on a GPU as the timing source saw it (kernels, copies, collectives' kernels), or a sampled
// launch's host call when no timing source is present.
struct DeviceActivity {
  uint32_t pid = 0;
  int device = 0;
  std::string kind;      // kernel | memcpy | memset | collective
  std::string name;
  uint64_t stream = 0;
  uint64_t start_ns = 0, end_ns = 0;  // unix ns
  uint64_t api_ns = 0;
  uint32_t api_tid = 0;
  uint64_t correlation = 0;
  uint64_t bytes = 0;
  std::string node;      // read back: the recording's node
};

// One training iteration of one process, found from its repeating collective pattern.
struct StepRecord {
  uint32_t pid = 0;
  uint64_t step = 0;            // 1, 2, ... per process
  uint64_t start_ns = 0, end_ns = 0;
  uint64_t collective_ns = 0;   // time the host spent inside collective calls and their waits
  uint64_t device_collective_ns = 0;  // device time of collective kernels, when known
  uint64_t device_compute_ns = 0;     // device time of other kernels, when known
  uint64_t gpu_idle_ns = 0;           // step time with no device work, when known
  bool device_known = false;
  std::string node;                   // read back: the recording's node
};

// A kernel launch seen by the sampled launch probe: name, the launching CPU stack, how often.
struct LaunchSample {
  uint32_t pid = 0;
  uint32_t tid = 0;
  std::string kernel;
  int64_t stack_id = 0;
  uint64_t count = 0;
};

// Sampled launch rows as read back: a LaunchSample of one window, its node, and its stack as an
// index into LaunchSamples::stacks (each stack the rows name, read once: leaf first, inlined
// functions expanded, as a Profile's). Memory calls are among them, named "[cudaMemcpy]" etc.
// (agent/gpu_comm_source.cpp), when their probe took a stack.
struct LaunchSampleRow {
  uint64_t start_ns = 0, end_ns = 0;  // the window the calls were counted in (unix ns)
  LaunchSample sample;                // stack_id: the store's id
  uint32_t stack_index = 0;           // into LaunchSamples::stacks
  std::string node;                   // the recording's node
};
struct LaunchSamples {
  std::vector<LaunchSampleRow> rows;
  std::vector<Stack> stacks;
};

struct ProfileFilter {
  std::optional<uint32_t> pid;
  std::optional<uint32_t> tid;
  std::optional<std::string> node;  // with pid: one process (pids repeat across nodes)
  std::optional<int> rank;
  // Only the processes of this job (ProcessInfo::job: TORCHELASTIC_RUN_ID / STRATA_JOB): a collector
  // holds many jobs, and rank R of each is another process.
  std::optional<std::string> job;
  std::optional<int64_t> recording;  // default: all recordings
  CountKind kind = CountKind::kOnCpu;
  // A time range [from_ns, to_ns) (unix ns; either end may be open): the windows that overlap it.
  // Stacks are counted per window, so a range is as fine as the windows are (default 10 s); the
  // profile's start_ns/duration_ns then say which span the counts cover.
  std::optional<uint64_t> from_ns;
  std::optional<uint64_t> to_ns;
};

// What a collector knows of one agent: its last batch and the health that batch carried.
struct AgentStatus {
  std::string agent_id;
  std::string node;
  uint64_t last_seen_ns = 0;  // unix ns, server clock
  uint64_t last_batch = 0;
  double interval_s = 0;      // how often the agent said it sends
  std::string health_json;    // the batch's AgentHealth, as JSON
};

// Kinds of agent-local ids a collector maps to its own (ingest: recordings and stacks).
enum class AgentIdKind : int { kRecording = 0, kStack = 1 };

// The diagnosis `strata serve` made of a job in one round (DESIGN §6: every window), as rendered
// for the API and the CLI. The store keeps the latest per job.
struct KeptDiagnosis {
  std::string job;
  uint64_t diagnosed_ns = 0;                         // server clock, unix ns
  uint64_t window_start_ns = 0, window_end_ns = 0;   // the analysis window
  uint32_t ranks = 0;
  uint32_t findings = 0;
  std::string report_json;  // DESIGN §8 `diagnose --json`
  std::string report_text;  // `strata diagnose`'s text
};

// One finding of one round; every round's findings are kept, so their history can be told.
struct KeptFinding {
  std::string job;
  uint64_t diagnosed_ns = 0;
  uint64_t window_start_ns = 0, window_end_ns = 0;
  int rank = -1;
  std::string node, layer, cause, culprit;
  double lost_ms_per_step = 0;
  double confidence = 0;
  std::string evidence_json;  // {"evidence":[...],"advice":"..."}
};

// A finding (job, rank, cause) over the rounds that reported it.
struct FindingHistory {
  int rank = -1;
  std::string node, layer, cause, culprit;  // as last reported
  uint64_t first_seen_ns = 0, last_seen_ns = 0;
  uint64_t first_window_start_ns = 0;       // where the first round that saw it put the change
  uint64_t rounds = 0;
  double max_lost_ms_per_step = 0;
};

// A bounded read of one kind of row (steps, collectives, device activity, metrics): the query API
// and the diagnosis read through these, so no reader needs a whole table. Rows come in time order
// (then node, pid); `offset` and `limit` page through them.
// The longest row the bounded reads are sure to return: a row's own span (a step, a collective
// call, a metric or stack window) is seconds, and one longer than an hour is a hang, which the
// diagnosis finds from the missing progress after it, not from the row. The bound lets a store
// find a span's rows through one time column (SQLite: an index on the rows' end, read up to this
// long after the span; ClickHouse: the daily partitions of the rows' start, from this long before
// it) instead of looking at every row before or after the span. A longer row may be left out.
constexpr uint64_t kMaxRowSpanNs = 3600ull * 1'000'000'000ull;

struct RowQuery {
  std::optional<int64_t> recording;
  std::optional<std::string> node;
  std::optional<uint32_t> pid;      // with node: one process
  std::optional<uint64_t> from_ns;  // rows whose time span ends after from_ns...
  std::optional<uint64_t> to_ns;    // ...and starts before to_ns
  std::string prefix;               // metrics, launch samples: names that start with it
  uint64_t offset = 0;
  uint64_t limit = 0;               // 0: no limit
  // The reader needs the rows in no particular order (it sums them, say), and asks for no page
  // (offset, limit): a store may skip its sort. The diagnosis's read of a span's device activity
  // (1.2M rows a minute at 8,000 ranks) spent half its SQLite time in the sort.
  bool any_order = false;
  // Only rows written after `after_seq` and up to `upto_seq` (Reader::write_seqs: the store's order
  // of writes, per table), for a reader that holds what it read before and wants what was written
  // since, whatever time the rows are of (an agent's batch comes up to a window after its rows'
  // time). Unset: any. A store without write sequences ignores them (it never hands them out).
  std::optional<int64_t> after_seq, upto_seq;
  // When set (steps, collectives, device activity, metrics): only the rows of the processes it
  // accepts, by node and pid (pid 0: a node's own series), the others dropped as they are read. A
  // collector's round keeps one job's rows; read whole and filtered after, a new job's first read
  // held every job's rows of the span at once (at 8,000 ranks, millions a job).
  std::function<bool(std::string_view node, uint32_t pid)> keep_process;
};

// How far each table the diagnosis reads by time has been written: the latest write's sequence
// number (SQLite: the largest rowid; rows are appended, so every row up to it is committed when it
// is read).
struct WriteSeqs {
  int64_t steps = 0, collectives = 0, device = 0, metrics = 0;
  bool operator==(const WriteSeqs&) const = default;
};

struct FrameRow {
  int64_t id = 0;
  Frame frame;
};

// The store's interfaces, split by who uses them (issue 16 item 8):
//   Writer  what a recording writes: the agent's pipeline, `strata record`, the collector's applier;
//   Reader  what reports, the diagnosis and the query API read;
//   Ledger  what only a collector keeps of its own: applied batches, agents' id mappings and
//           heartbeats, collectors sharing the store, its kept diagnoses, retention.
// Store is all three (the SQLite and ClickHouse backends); a user takes the narrowest it needs.
class Writer {
 public:
  virtual ~Writer() = default;
  virtual Result<int64_t> begin_recording(const RecordingInfo& info) = 0;
  virtual Status end_recording(int64_t recording, uint64_t ended_ns) = 0;
  virtual Status put_process(int64_t recording, const ProcessInfo& p) = 0;
  // Returns the id of the stack (leaf first), adding its frames and itself if new. `method` says how
  // the stack was unwound (UnwindMethod); the same frames unwound another way are another stack.
  virtual Result<int64_t> intern_stack(const Stack& stack, UnwindMethod method = UnwindMethod::kFramePointer) = 0;
  // `fidelity`: how the window's samples were taken (on-CPU windows; off-CPU ones are measured,
  // not sampled, and leave it empty).
  virtual Status put_window(int64_t recording, uint64_t start_ns, uint64_t end_ns, CountKind kind,
                            const std::vector<StackCount>& counts, const WindowFidelity& fidelity = {}) = 0;
  virtual Status put_stat(int64_t recording, const std::string& key, double value) = 0;
  virtual Status put_metrics(int64_t recording, uint64_t start_ns, uint64_t end_ns,
                             const std::vector<Metric>& metrics) = 0;
  virtual Status put_communicators(int64_t recording, const std::vector<CommunicatorRecord>& r) = 0;
  virtual Status put_collectives(int64_t recording, const std::vector<CollectiveRecord>& r) = 0;
  virtual Status put_device_activity(int64_t recording, const std::vector<DeviceActivity>& r) = 0;
  virtual Status put_steps(int64_t recording, const std::vector<StepRecord>& r) = 0;
  virtual Status put_launch_samples(int64_t recording, uint64_t start_ns, uint64_t end_ns,
                                    const std::vector<LaunchSample>& r) = 0;
  // Frames without a function name (for symbolization), and the update that fills them in.
  virtual Result<std::vector<FrameRow>> unsymbolized_frames() = 0;
  virtual Status update_frame_symbols(const std::vector<FrameRow>& rows) = 0;
  // Writes are grouped: everything between begin/commit lands at once or not at all.
  virtual Status begin() = 0;
  virtual Status commit() = 0;
  // Abandons the writes since begin() (and any id caches they filled).
  virtual Status rollback() { return Error{"this store cannot roll back"}; }
};

class Reader {
 public:
  virtual ~Reader() = default;
  virtual Result<Profile> load_profile(const ProfileFilter& filter) = 0;
  // The profiles of several filters, in their order: what load_profile gives for each. A store
  // where each read is a round trip (ClickHouse) reads many nodes' profiles of a span in one; the
  // rest read them one by one.
  virtual Result<std::vector<Profile>> load_profiles(const std::vector<ProfileFilter>& filters) {
    std::vector<Profile> out;
    out.reserve(filters.size());
    for (const auto& f : filters) {
      auto p = load_profile(f);
      if (!p) return p.error();
      out.push_back(std::move(*p));
    }
    return out;
  }
  virtual Result<std::vector<ProcessInfo>> processes(std::optional<int64_t> recording = std::nullopt) = 0;
  virtual Result<std::vector<std::pair<std::string, double>>> stats(int64_t recording) = 0;
  virtual Result<std::optional<int64_t>> latest_recording() = 0;
  struct MetricRow {
    uint64_t start_ns = 0, end_ns = 0;
    Metric metric;
    std::string node;  // the recording's node (metric.pid == 0: this node's own series)
  };
  virtual Result<std::vector<CommunicatorRecord>> communicators(std::optional<int64_t> recording = std::nullopt) = 0;
  virtual Result<std::vector<CollectiveRecord>> collectives(std::optional<int64_t> recording = std::nullopt,
                                                            std::optional<uint32_t> pid = std::nullopt) = 0;
  virtual Result<std::vector<DeviceActivity>> device_activity(std::optional<int64_t> recording = std::nullopt,
                                                              std::optional<uint32_t> pid = std::nullopt) = 0;
  virtual Result<std::vector<StepRecord>> steps(std::optional<int64_t> recording = std::nullopt,
                                                std::optional<uint32_t> pid = std::nullopt) = 0;
  struct ThreadWindow {
    uint64_t start_ns = 0, end_ns = 0;
    uint32_t pid = 0, tid = 0;
    std::string comm;
    uint64_t samples = 0;
    std::string node;
    unsigned sample_hz = 0;  // the window's rate (WindowFidelity); 0: the recording's
  };
  // The end of the latest step the store holds (of one recording), or none: where "the latest
  // stretch" of a job ends. The default reads every step; the stores answer from an index.
  virtual Result<std::optional<uint64_t>> latest_step_ns(std::optional<int64_t> recording = std::nullopt);
  // Work this connection did to answer reads, in a store's own unit (SQLite: thousands of virtual
  // machine instructions), for tests and benches that check a read's cost does not grow with what
  // the store holds; 0 where the store cannot say.
  virtual uint64_t read_work() const { return 0; }
  // A number that changes whenever the store's data may have changed since the last call (any
  // table; this connection's writes or another's), for a reader that keeps what it read and reads
  // again only after a change. None where the store cannot tell, and inside a transaction (what a
  // read sees there may be rolled back): read again. The default: none.
  virtual Result<std::optional<uint64_t>> data_version() { return std::optional<uint64_t>{}; }
  // The tables' write sequences now (RowQuery::after_seq), or none where the store has no such
  // order (ClickHouse: its parts merge; a reader then finds new rows by time).
  virtual Result<std::optional<WriteSeqs>> write_seqs() { return std::optional<WriteSeqs>{}; }
  // The bounded reads (RowQuery). A store answers them in its query language; the defaults here
  // read through the unbounded calls above and filter, for stores whose data is small anyway.
  virtual Result<std::vector<StepRecord>> query_steps(const RowQuery& q);
  virtual Result<std::vector<CollectiveRecord>> query_collectives(const RowQuery& q);
  virtual Result<std::vector<DeviceActivity>> query_device_activity(const RowQuery& q);
  virtual Result<std::vector<MetricRow>> query_metrics(const RowQuery& q);
  // The same four reads, appended to a vector the caller keeps: a collector's rounds read into the
  // same memory every time. A new vector per read of a million rows pays its page faults and its
  // regrowth copies every round (measured at 8,000 ranks, in this VM: most of the CPU of a
  // round's store reads; SQLite's own work was a small part). The defaults append the reads above.
  virtual Status append_steps(const RowQuery& q, std::vector<StepRecord>& out);
  virtual Status append_collectives(const RowQuery& q, std::vector<CollectiveRecord>& out);
  virtual Status append_device_activity(const RowQuery& q, std::vector<DeviceActivity>& out);
  virtual Status append_metrics(const RowQuery& q, std::vector<MetricRow>& out);
  // Sampled launches and memory calls (RowQuery; `prefix`: kernel or call names that start with
  // it, "[" for the memory calls), in time order (then node, pid, tid, name, stack). A collector's
  // REST reader asks its /api/v1/launch_samples; a store that does not keep them says none.
  virtual Result<LaunchSamples> query_launch_samples(const RowQuery& /*q*/) { return LaunchSamples{}; }
  // On-CPU samples per window and thread (the CPU thread tracks of a timeline), of the recording,
  // node, process and windows overlapping [from_ns, to_ns) that `q` names (the rest of it unused).
  virtual Result<std::vector<ThreadWindow>> thread_windows(const RowQuery& q = {}) = 0;
  virtual Result<unsigned> sample_hz(std::optional<int64_t> recording = std::nullopt) = 0;
  // Where fidelity was reduced (WindowFidelity): runs of on-CPU windows below their recording's
  // configured rate or unwinding, in time order (then node); with `from_ns` / `to_ns`, of the
  // windows that overlap [from_ns, to_ns) (a page's span: not every window a collector holds).
  // Stores that do not keep it say none.
  virtual Result<std::vector<ReducedFidelity>> reduced_fidelity(std::optional<int64_t> /*recording*/ = std::nullopt,
                                                                std::optional<uint64_t> /*from_ns*/ = std::nullopt,
                                                                std::optional<uint64_t> /*to_ns*/ = std::nullopt) {
    return std::vector<ReducedFidelity>{};
  }
  // Metrics whose name starts with `prefix` ("" for all), in time order.
  virtual Result<std::vector<MetricRow>> metrics(const std::string& prefix,
                                                 std::optional<int64_t> recording = std::nullopt) = 0;
};

class Ledger {
 public:
  virtual ~Ledger() = default;
  // -- the collector's bookkeeping (`strata serve`): which agent batches were applied (exactly
  // once, in the same transaction as their rows), how agents' local ids map to this store's, and
  // each agent's last heartbeat. Stores that are not a collector's leave them unsupported.
  virtual Result<bool> batch_applied(const std::string& /*agent*/, uint64_t /*batch_id*/) {
    return Error{"this store does not keep ingest bookkeeping"};
  }
  virtual Status mark_batch_applied(const std::string& /*agent*/, uint64_t /*batch_id*/, uint64_t /*received_ns*/) {
    return Error{"this store does not keep ingest bookkeeping"};
  }
  // The batch whose rows follow, once batch_applied said it is new. A store without transactions
  // across tables (ClickHouse) tags the rows with it and first removes what an interrupted earlier
  // attempt at the same batch wrote, so a batch lands exactly once; a transactional one needs nothing.
  virtual Status begin_batch(const std::string& /*agent*/, uint64_t /*batch_id*/) { return {}; }
  // The batches of one transaction, before batch_applied and begin_batch are asked of each: a store
  // where each question is a round trip (ClickHouse) answers them all in one read here (two per
  // batch before: ~20 s of a 1,000-node run's server time); the answers last until commit or
  // rollback. A store that looks each one up cheaply needs nothing.
  virtual Status prepare_batches(const std::vector<std::pair<std::string, uint64_t>>& /*batches*/) { return {}; }
  virtual Result<std::vector<std::pair<int64_t, int64_t>>> agent_ids(const std::string& /*agent*/,
                                                                     AgentIdKind /*kind*/) {
    return Error{"this store does not keep ingest bookkeeping"};
  }
  // One mapping (a point lookup), and the `limit` newest of an agent's mappings (the highest local
  // ids: those it still refers to), so a collector caches a bounded part of an unbounded table. The
  // defaults read agent_ids().
  virtual Result<std::optional<int64_t>> agent_id(const std::string& agent, AgentIdKind kind, int64_t local_id);
  virtual Result<std::vector<std::pair<int64_t, int64_t>>> recent_agent_ids(const std::string& agent, AgentIdKind kind,
                                                                            size_t limit);
  virtual Status put_agent_id(const std::string& /*agent*/, AgentIdKind /*kind*/, int64_t /*local_id*/,
                              int64_t /*store_id*/) {
    return Error{"this store does not keep ingest bookkeeping"};
  }
  virtual Status put_agent_status(const AgentStatus& /*status*/) {
    return Error{"this store does not keep ingest bookkeeping"};
  }
  virtual Result<std::vector<AgentStatus>> agents() { return std::vector<AgentStatus>{}; }

  // -- collectors sharing one store (a ClickHouse cluster): notes `self` as alive at now_ns and
  // returns the collectors seen within ttl_ns, self included, sorted. A store only one collector
  // writes answers {self}.
  virtual Result<std::vector<std::string>> live_collectors(const std::string& self, uint64_t /*now_ns*/,
                                                           uint64_t /*ttl_ns*/) {
    return std::vector<std::string>{self};
  }
  // True when other collectors may write this store too (then jobs are split between them).
  virtual bool shared() const { return false; }
  // Jobs a collector got new data for but another collector diagnoses: noted here for their owner,
  // which reads the jobs noted at or after since_ns.
  virtual Status note_jobs(const std::vector<std::string>& /*jobs*/, uint64_t /*now_ns*/) { return {}; }
  virtual Result<std::vector<std::pair<std::string, uint64_t>>> noted_jobs(uint64_t /*since_ns*/) {
    return std::vector<std::pair<std::string, uint64_t>>{};
  }

  // -- the collector's kept diagnoses: the latest round per job replaces the one before; every
  // round's findings are added (in one transaction where the store has them). Stores without
  // them (a file from before schema 3 read only, the remote reader) keep nothing.
  virtual Status put_diagnosis(const KeptDiagnosis& /*d*/, const std::vector<KeptFinding>& /*findings*/) {
    return Error{"this store does not keep diagnoses"};
  }
  // The kept diagnosis of `job`, or of every job (nullptr), ordered by job.
  virtual Result<std::vector<KeptDiagnosis>> kept_diagnoses(const std::string* /*job*/) {
    return std::vector<KeptDiagnosis>{};
  }
  Result<std::optional<KeptDiagnosis>> latest_diagnosis(const std::string& job) {
    auto r = kept_diagnoses(&job);
    if (!r) return r.error();
    if (r->empty()) return std::optional<KeptDiagnosis>{};
    return std::optional<KeptDiagnosis>{std::move(r->front())};
  }
  Result<std::vector<KeptDiagnosis>> latest_diagnoses() { return kept_diagnoses(nullptr); }
  // Per (rank, cause) of the job, newest last seen first.
  virtual Result<std::vector<FindingHistory>> finding_history(const std::string& /*job*/) {
    return std::vector<FindingHistory>{};
  }

  // The store's write-ahead log (SQLite: FILE-wal): its size (a stat of the file, safe from any
  // thread without the store's lock), and a checkpoint that copies it into the store and truncates
  // it. Stores without one: 0, and nothing to do.
  virtual uint64_t log_bytes() const { return 0; }
  virtual Status truncate_log() { return {}; }
  // Retention: deletes at most `max_rows` rows of each time table (steps, collectives, device
  // activity, metrics, stack windows, launch samples, kept findings, the ingest ledger) that
  // ended before `cutoff_ns`, in one short transaction; returns how many it deleted, so a caller
  // repeats it (releasing its lock between calls) until none come back. Processes,
  // recordings, frames and stacks stay (small, and a running process may be older than the cutoff).
  virtual Result<uint64_t> delete_before(uint64_t /*cutoff_ns*/, uint64_t /*max_rows*/) {
    return Error{"this store has no retention by deletion"};
  }
};

// How a connection that writes an SQLite file uses memory and the write-ahead log. The defaults
// are SQLite's own, right for one process writing its own recording (`strata record`, an agent's
// local file); a collector that takes many nodes' batches asks for more (server/server.cpp).
struct SqliteTuning {
  int cache_kib = 0;                 // the connection's page cache; 0: SQLite's default (2 MB)
  int wal_autocheckpoint_pages = 0;  // log pages between automatic checkpoints; 0: SQLite's 1,000
};

// Rows SQLite stepped through in full-table scans, over every SQLite statement this process has
// finished: a read whose cost grows with what the file holds, not with what it asks for, shows here.
uint64_t sqlite_full_scan_steps();

class Store : public Writer, public Reader, public Ledger {
 public:
  enum class Mode {
    kCreateOrAppend,  // create a new store, or append to an existing strata store
    kReadOnly,        // an existing strata store; never written
  };
  // A file that is not a strata store (corrupt, foreign, newer schema) is refused with the reason,
  // and left untouched.
  static Result<std::unique_ptr<Store>> open_sqlite(const std::string& path, Mode mode, const SqliteTuning& tuning = {});
  // ClickHouse through its HTTP interface: clickhouse://HOST:PORT/DB (PORT: the HTTP port, 8123).
  // The database and tables are created when missing (kCreateOrAppend).
  static Result<std::unique_ptr<Store>> open_clickhouse(const std::string& url, Mode mode);
  // A collector's data through its REST API (read only): http://HOST:PORT, with a bearer token.
  static Result<std::unique_ptr<Reader>> open_remote(const std::string& url, const std::string& token);
  ~Store() override = default;
};

// The body of a 200 answer to GET `path` (with its query) from the collector at `url`
// (http://HOST:PORT; a trailing '/' is ignored), with the bearer token when not empty; else the
// reason on one line, an unreachable or busy collector (or an agent behind it that did not answer:
// 502, 503) as the environment. What the remote reader reads its rows with, and the commands that
// print an answer of the collector's (a rank's timeline, the kept diagnosis, a node's drilldown).
Result<std::string> remote_get(std::string url, const std::string& token, const std::string& path, int read_timeout_s = 120);

}  // namespace strata::store
