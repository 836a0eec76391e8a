"""One rank of the testbed's training-like job, in Python: the same step as strata-sim-rank, through
ctypes onto the stand-in libcudart.so.13 / libnccl.so.2, so a profiler sees Python frames
(load_batch, preprocess, forward, backward, optimizer_step) above the CUDA and NCCL calls.

Started by `strata-sim run --python`; runs on any Python 3 (plain ctypes, no numpy).
Reports each step to strata-sim on fd STRATA_SIM_REPORT_FD:
    step <rank> <step> <step_ms> <load_ms> <compute_ms> <comm_ms> <collectives> <cpu_ms> <runq_ms>
"""
import ctypes
import os
import socket
import sys
import time

LIB = os.environ.get("STRATA_TESTBED_LIB", "")
RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", str(RANK)))
STEPS = int(os.environ.get("STRATA_SIM_STEPS", "10"))
SCALE = float(os.environ.get("STRATA_SIM_SCALE", "1"))
FSDP = os.environ.get("STRATA_SIM_MODE", "ddp") == "fsdp"
REPORT_FD = int(os.environ.get("STRATA_SIM_REPORT_FD", "-1"))
SCRATCH_MB = int(os.environ.get("STRATA_SIM_SCRATCH_MB", "8"))
SAMPLES = int(os.environ.get("STRATA_SIM_SAMPLES", "0") or 0)  # data reads per step; 0: one batch

LAYERS = 6
BUCKETS = 3
BUCKET_ELEMS = 64 * 1024
BATCH_BYTES = 512 * 1024
LOAD_UNITS = 200        # rounds of Python work over the batch: ~10 ms (~50 us a round here)
PROBES, PROBE_UNITS = 5, 8  # slow_augment's calibration: the fastest of 5 probes of ~0.5 ms each
PS_PER_THREAD = 10      # testbed/include/testbed/cost_model.h
NCCL_FLOAT, NCCL_SUM = 7, 0
MEMCPY_H2D = 1
STREAM_NON_BLOCKING = 1


def die(msg):
    sys.stderr.write("strata-sim-rank (python) %d: %s\n" % (RANK, msg))
    sys.exit(1)


def load(name):
    path = os.path.join(LIB, name) if LIB else name
    try:
        return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        die("cannot load %s: %s" % (path, e))


cudart = load("libcudart.so.13")
nccl = load("libnccl.so.2")
kernels = load("libtestbed_kernels.so")


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class NcclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


vp = ctypes.c_void_p
cudart.cudaLaunchKernel.argtypes = [vp, Dim3, Dim3, vp, ctypes.c_size_t, vp]
cudart.cudaMemcpyAsync.argtypes = [vp, vp, ctypes.c_size_t, ctypes.c_int, vp]
cudart.cudaMalloc.argtypes = [ctypes.POINTER(vp), ctypes.c_size_t]
cudart.cudaStreamCreateWithFlags.argtypes = [ctypes.POINTER(vp), ctypes.c_uint]
cudart.cudaStreamSynchronize.argtypes = [vp]
cudart.cudaEventCreate.argtypes = [ctypes.POINTER(vp)]
cudart.cudaEventRecord.argtypes = [vp, vp]
cudart.cudaStreamWaitEvent.argtypes = [vp, vp, ctypes.c_uint]
cudart.cudaEventElapsedTime.argtypes = [ctypes.POINTER(ctypes.c_float), vp, vp]
cudart.cudaGetErrorString.restype = ctypes.c_char_p
kernels.strata_testbed_kernel.restype = vp
kernels.strata_testbed_kernel.argtypes = [ctypes.c_char_p]
nccl.ncclGetUniqueId.argtypes = [ctypes.POINTER(NcclUniqueId)]
nccl.ncclCommInitRank.argtypes = [ctypes.POINTER(vp), ctypes.c_int, NcclUniqueId, ctypes.c_int]
nccl.ncclAllReduce.argtypes = [vp, vp, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, vp, vp]
nccl.ncclAllGather.argtypes = [vp, vp, ctypes.c_size_t, ctypes.c_int, vp, vp]
nccl.ncclReduceScatter.argtypes = [vp, vp, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, vp, vp]
nccl.ncclCommGetAsyncError.argtypes = [vp, ctypes.POINTER(ctypes.c_int)]
nccl.ncclCommDestroy.argtypes = [vp]
nccl.ncclGetErrorString.restype = ctypes.c_char_p
nccl.ncclGetLastError.restype = ctypes.c_char_p
nccl.ncclGetLastError.argtypes = [vp]


def cuda(rc, what):
    if rc != 0:
        die("%s: %s" % (what, cudart.cudaGetErrorString(rc).decode()))


def nccl_ok(rc, what):
    if rc != 0:
        die("%s: %s" % (what, nccl.ncclGetErrorString(rc).decode()))


def kernel(role):
    k = kernels.strata_testbed_kernel(role.encode())
    if not k:
        die("no kernel %s" % role)
    return k


K = {r: kernel(r) for r in ("gemm_fwd", "gemm_bwd_data", "gemm_bwd_weight", "relu", "add",
                            "layer_norm", "softmax", "nll_loss", "adam")}


ADAM_OPS_PER_TENSOR = 5  # as rank_main.cpp's kAdamOpsPerTensor
OP_HOST_US = 8  # the framework's checks and dispatch per operation, as rank_main.cpp's kOpHostUs
INF_CHECK = os.environ.get("STRATA_SIM_INF_CHECK", "") == "1"


def launch(role, us, stream):
    threads = int(max(us, 1) * 1000000 // PS_PER_THREAD)
    grid = Dim3(max(1, threads // 256), 1, 1)
    cuda(cudart.cudaLaunchKernel(K[role], grid, Dim3(256, 1, 1), None, 0, stream), "cudaLaunchKernel")


def new_event():
    e = vp()
    cuda(cudart.cudaEventCreate(ctypes.byref(e)), "cudaEventCreate")
    return e


def elapsed(a, b):
    ms = ctypes.c_float()
    cuda(cudart.cudaEventElapsedTime(ctypes.byref(ms), a, b), "cudaEventElapsedTime")
    return ms.value


def exchange_unique_id():
    """Rank 0 hands the ncclUniqueId to the others over MASTER_ADDR:MASTER_PORT (torch's store)."""
    uid = NcclUniqueId()
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ.get("MASTER_PORT", "29500"))
    if RANK == 0:
        nccl_ok(nccl.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("0.0.0.0", port))
        srv.listen(128)
        for _ in range(WORLD - 1):
            conn, _ = srv.accept()
            conn.sendall(bytes(uid))
            conn.close()
        srv.close()
        return uid
    deadline = time.time() + 60
    while True:
        try:
            with socket.create_connection((addr, port), timeout=5) as c:
                data = b""
                while len(data) < 128:
                    chunk = c.recv(128 - len(data))
                    if not chunk:
                        die("store: rank 0 closed the connection")
                    data += chunk
                ctypes.memmove(ctypes.byref(uid), data, 128)
                return uid
        except OSError:
            if time.time() > deadline:
                die("store: cannot reach rank 0 at %s:%d" % (addr, port))
            time.sleep(0.05)


def parse_fault():
    spec = os.environ.get("STRATA_SIM_FAULT", "")
    fault = {"kind": "", "start_step": 1 << 30, "ms": 0.0, "factor": 1.0, "tensors": 0.0}
    if not spec:
        return fault
    kind, _, rest = spec.partition(":")
    fault["kind"] = kind
    for item in rest.split(","):
        key, _, value = item.partition("=")
        if key in fault and value:
            fault[key] = float(value)
    fault["start_step"] = int(fault["start_step"])
    return fault


class Data:
    def __init__(self):
        self.path = os.environ.get("STRATA_SIM_DATA", "")
        self.direct = os.environ.get("STRATA_SIM_DATA_DIRECT", "0") == "1"
        self.fd = -1
        self.size = 0
        self.buf = None
        if self.path:
            flags = os.O_RDONLY | (getattr(os, "O_DIRECT", 0) if self.direct else 0)
            self.fd = os.open(self.path, flags)
            self.size = os.lseek(self.fd, 0, os.SEEK_END)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)
            if self.direct:
                import mmap
                self.buf = mmap.mmap(-1, 4096)  # page aligned, as O_DIRECT wants


def runqueue_wait_ms():
    """Time this process's threads waited runnable on a run queue (schedstat), ms."""
    total = 0
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return 0.0
    for tid in tids:
        try:
            with open("/proc/self/task/%s/schedstat" % tid) as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            pass
    return total / 1e6


def load_batch(data, step, nbytes, reads=0):
    """Reads 4 KiB samples at shuffled offsets of the data file (a map-style dataset): `reads`
    of them (0: as many as fill the batch); more are folded into the batch, as in rank_main.cpp."""
    if data.fd < 0 or data.size < 4096 or nbytes <= 0:
        return bytes(nbytes)
    out = bytearray(nbytes)
    samples = data.size // 4096
    reads = reads or (nbytes + 4095) // 4096
    x = ((step << 20) ^ RANK ^ 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    at = 0
    for _ in range(reads):
        x ^= (x << 13) & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 7
        x ^= (x << 17) & 0xFFFFFFFFFFFFFFFF
        off = (x % samples) * 4096
        if data.direct:
            os.preadv(data.fd, [data.buf], off)
            sample = data.buf[:4096]
        else:
            sample = os.pread(data.fd, 4096, off)
        if at >= nbytes:
            at = 0
        n = min(4096, nbytes - at)
        out[at:at + n] = sample[:n]
        at += 4096
    return bytes(out)


def cpu_work(batch, units):
    h = 1469598103934665603
    view = batch[::64]
    for _ in range(int(units)):
        for b in view[::8]:
            h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def preprocess(batch, units):
    """Decode + augment: fixed Python work, and a fresh scratch buffer each step."""
    h = cpu_work(batch, units)
    if SCRATCH_MB:
        scratch = bytearray(SCRATCH_MB << 20)
        scratch[::4096] = bytes(len(scratch[::4096]))
        h ^= scratch[len(scratch) // 2]
    return h


def slow_augment(batch, units):
    """The host-hotspot fault: extra CPU work on the critical path."""
    return cpu_work(batch, units)


class Model:
    def __init__(self, comm, compute, comm_stream):
        self.comm, self.compute, self.comm_stream = comm, compute, comm_stream
        self.grads = []
        for _ in range(BUCKETS):
            p = vp()
            cuda(cudart.cudaMalloc(ctypes.byref(p), BUCKET_ELEMS * 4), "cudaMalloc")
            self.grads.append(p)
        self.shard_elems = BUCKET_ELEMS // WORLD
        self.shard, self.gathered, self.d_batch = vp(), vp(), vp()
        cuda(cudart.cudaMalloc(ctypes.byref(self.shard), self.shard_elems * 4 + 4), "cudaMalloc")
        cuda(cudart.cudaMalloc(ctypes.byref(self.gathered), self.shard_elems * WORLD * 4 + 4), "cudaMalloc")
        cuda(cudart.cudaMalloc(ctypes.byref(self.d_batch), BATCH_BYTES * 4), "cudaMalloc")
        self.c0, self.c1, self.grad_ready, self.comm_done = (new_event() for _ in range(4))
        self.cs = [new_event() for _ in range(2 * LAYERS + BUCKETS)]
        self.ce = [new_event() for _ in range(2 * LAYERS + BUCKETS)]
        self.ncomm = 0

    def collective(self, fn):
        cuda(cudart.cudaEventRecord(self.cs[self.ncomm], self.comm_stream), "cudaEventRecord")
        fn()
        cuda(cudart.cudaEventRecord(self.ce[self.ncomm], self.comm_stream), "cudaEventRecord")
        self.ncomm += 1

    def forward(self, batch, scale):
        cuda(cudart.cudaMemcpyAsync(self.d_batch, batch, len(batch), MEMCPY_H2D, self.compute), "cudaMemcpyAsync")
        cuda(cudart.cudaEventRecord(self.c0, self.compute), "cudaEventRecord")
        self.ncomm = 0
        for _ in range(LAYERS):
            if FSDP:
                self.collective(lambda: nccl_ok(nccl.ncclAllGather(
                    self.shard, self.gathered, self.shard_elems, NCCL_FLOAT, self.comm, self.comm_stream),
                    "ncclAllGather"))
                cudart.cudaStreamWaitEvent(self.compute, self.ce[self.ncomm - 1], 0)
            launch("layer_norm", 300 * SCALE * scale, self.compute)
            launch("gemm_fwd", 5000 * SCALE * scale, self.compute)
            launch("relu", 200 * SCALE * scale, self.compute)
        launch("softmax", 300 * SCALE * scale, self.compute)
        launch("nll_loss", 200 * SCALE * scale, self.compute)

    def backward(self, scale):
        per_bucket = LAYERS // BUCKETS
        for layer in range(LAYERS - 1, -1, -1):
            launch("gemm_bwd_data", 5000 * SCALE * scale, self.compute)
            launch("gemm_bwd_weight", 5000 * SCALE * scale, self.compute)
            launch("add", 200 * SCALE * scale, self.compute)
            if FSDP or layer % per_bucket == 0:
                cudart.cudaEventRecord(self.grad_ready, self.compute)
                cudart.cudaStreamWaitEvent(self.comm_stream, self.grad_ready, 0)
                if FSDP:
                    self.collective(lambda: nccl_ok(nccl.ncclReduceScatter(
                        self.grads[0], self.shard, self.shard_elems, NCCL_FLOAT, NCCL_SUM, self.comm,
                        self.comm_stream), "ncclReduceScatter"))
                else:
                    g = self.grads[layer // per_bucket]
                    self.collective(lambda: nccl_ok(nccl.ncclAllReduce(
                        g, g, BUCKET_ELEMS, NCCL_FLOAT, NCCL_SUM, self.comm, self.comm_stream), "ncclAllReduce"))
        cuda(cudart.cudaEventRecord(self.c1, self.compute), "cudaEventRecord")

    def optimizer_step(self, per_tensor=0):
        cudart.cudaEventRecord(self.comm_done, self.comm_stream)
        cudart.cudaStreamWaitEvent(self.compute, self.comm_done, 0)
        # The host waits for the gradients first, as AMP's GradScaler does to read found_inf (every
        # rank of a launch-bound run; rank_main.cpp's inf_check).
        if INF_CHECK:
            cuda(cudart.cudaStreamSynchronize(self.compute), "cudaStreamSynchronize")
        if per_tensor:
            self.optimizer_step_per_tensor(per_tensor)
        else:
            launch("adam", 3000 * SCALE, self.compute)
        cuda(cudart.cudaStreamSynchronize(self.compute), "cudaStreamSynchronize")
        err = ctypes.c_int()
        nccl.ncclCommGetAsyncError(self.comm, ctypes.byref(err))
        if err.value != 0:
            die("NCCL communicator failed: %s" % nccl.ncclGetLastError(self.comm).decode())

    def optimizer_step_per_tensor(self, tensors):
        """The launch-bound fault: Adam stepped tensor by tensor (foreach and fused off), each of its
        elementwise operations a tiny kernel whose launch costs the host more than the device needs
        to run it (rank_main.cpp's optimizer_step_per_tensor): the framework's work per operation,
        then the launch."""
        for _ in range(tensors):
            for _ in range(ADAM_OPS_PER_TENSOR):
                until = time.perf_counter() + OP_HOST_US / 1e6
                while time.perf_counter() < until:
                    pass
                launch("add", 1, self.compute)

    def times(self):
        comm_ms = sum(elapsed(self.cs[i], self.ce[i]) for i in range(self.ncomm))
        return elapsed(self.c0, self.c1), comm_ms


def train():
    # Framework start-up before the first CUDA/NCCL call (imports, model construction), as real
    # training processes have. Default 300 ms; STRATA_SIM_STARTUP_MS.
    time.sleep(int(os.environ.get("STRATA_SIM_STARTUP_MS", "300")) / 1000.0)
    cuda(cudart.cudaSetDevice(LOCAL_RANK), "cudaSetDevice")
    compute, comm_stream = vp(), vp()
    cuda(cudart.cudaStreamCreateWithFlags(ctypes.byref(compute), STREAM_NON_BLOCKING), "cudaStreamCreate")
    cuda(cudart.cudaStreamCreateWithFlags(ctypes.byref(comm_stream), STREAM_NON_BLOCKING), "cudaStreamCreate")
    uid = exchange_unique_id()
    comm = vp()
    nccl_ok(nccl.ncclCommInitRank(ctypes.byref(comm), WORLD, uid, RANK), "ncclCommInitRank")
    model = Model(comm, compute, comm_stream)
    fault = parse_fault()
    data = Data()

    # slow_augment's work per ms: the fastest of a few probes. One probe was the first call of
    # cpu_work, cold (1.6 ms where a warm one takes 0.12): the host-hotspot fault then ran a
    # thirteenth of its ms and had no effect on any py run of the accuracy bench.
    probe = bytes(BATCH_BYTES)
    best_ms = float("inf")
    for _ in range(PROBES):
        t = time.perf_counter()
        cpu_work(probe, PROBE_UNITS)
        best_ms = min(best_ms, (time.perf_counter() - t) * 1000)
    units_per_ms = PROBE_UNITS / max(0.05, best_ms)

    for step in range(STEPS):
        faulty = step >= fault["start_step"]
        scale = fault["factor"] if faulty and fault["kind"] == "workload-imbalance" else 1.0
        t0, cpu0, wait0 = time.perf_counter(), time.process_time(), runqueue_wait_ms()
        batch = load_batch(data, step, int(BATCH_BYTES * scale), int(SAMPLES * scale))
        preprocess(batch, LOAD_UNITS * scale)
        if faulty and fault["kind"] == "host-hotspot":
            slow_augment(batch, fault["ms"] * units_per_ms)
        load_ms = (time.perf_counter() - t0) * 1000
        model.forward(batch, scale)
        model.backward(scale)
        model.optimizer_step(int(fault["tensors"]) if faulty and fault["kind"] == "launch-bound" else 0)
        compute_ms, comm_ms = model.times()
        step_ms = (time.perf_counter() - t0) * 1000
        cpu_ms, runq_ms = (time.process_time() - cpu0) * 1000, runqueue_wait_ms() - wait0
        if REPORT_FD >= 0:
            os.write(REPORT_FD, ("step %d %d %.3f %.3f %.3f %.3f %d %.3f %.3f\n" % (
                RANK, step, step_ms, load_ms, compute_ms, comm_ms, model.ncomm, cpu_ms, runq_ms)).encode())
    nccl.ncclCommDestroy(comm)


if __name__ == "__main__":
    train()
