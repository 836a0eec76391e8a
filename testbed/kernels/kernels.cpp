// Host stubs of the testbed's "GPU kernels" (libtestbed_kernels.so, the stand-in for the kernels
// that libtorch_cuda.so / cuBLAS would carry).
//
// On a real GPU, cudaLaunchKernel's `func` argument is the address of a host stub that nvcc emits
// for each __global__ function; the stub's symbol is the kernel's mangled name, which is how a
// profiler names a launch. These stubs reproduce that: C++ templates in the namespaces PyTorch and
// CUTLASS use, so their mangled names are the real ones' shape, and extern "C" names for cuBLAS
// kernels. All are exported (.dynsym), so a profiler can symbolize a `func` pointer from the .so.
// The bodies are never meant to run; each writes a distinct mark so the linker cannot fold them.
#include <cstddef>
#include <cstdint>
#include <cstring>

#define TESTBED_EXPORT __attribute__((visibility("default"), noinline, used))

namespace {
volatile int g_mark;
}  // namespace

// ---- cuBLAS kernels: extern "C" names, as in the real libcublasLt.
extern "C" {
TESTBED_EXPORT void ampere_sgemm_128x64_tn() { g_mark = 1; }
TESTBED_EXPORT void ampere_sgemm_128x64_nn() { g_mark = 2; }
TESTBED_EXPORT void ampere_sgemm_64x64_nt() { g_mark = 3; }
TESTBED_EXPORT void
sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas() {
  g_mark = 4;
}
}

// ---- CUTLASS
struct cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4 {
  struct Params {
    int m, n, k;
    const float* a;
    const float* b;
    float* c;
  };
};
namespace cutlass {
template <typename Operator>
TESTBED_EXPORT void Kernel2(typename Operator::Params params) {
  g_mark = 10 + params.m;
}
template void Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(
    cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4::Params);
}  // namespace cutlass

// ---- PyTorch ATen kernels
namespace at {
namespace detail {
template <typename T, int N>
struct Array {
  T data[N];
};
}  // namespace detail
namespace native {
template <typename T>
struct CUDAFunctor_add {
  T alpha;
};
template <typename T>
struct ReluFunctor {
  T zero;
};
template <typename T>
struct MulFunctor {
  T unused;
};
template <typename acc_t>
struct func_wrapper_t {
  acc_t ident;
};
template <typename scalar_t, typename ops_t, typename index_t, typename out_scalar_t, int vt0>
struct ReduceOp {
  ops_t ops;
  index_t n;
  out_scalar_t* dst;
  scalar_t ident;
};
template <int N>
struct TensorListMetadata {
  void* addresses[N][110];
};
template <typename T, int depth>
struct FusedAdamMathFunctor {
  T lr;
};
struct SoftMaxForwardEpilogue {
  float max_input;
};

template <int vec_size, typename func_t, typename array_t>
TESTBED_EXPORT void vectorized_elementwise_kernel(int N, func_t f, array_t data) {
  g_mark = 20 + vec_size + N + static_cast<int>(sizeof(f)) + static_cast<int>(sizeof(data));
}
template void vectorized_elementwise_kernel<4, CUDAFunctor_add<float>, detail::Array<char*, 3>>(
    int, CUDAFunctor_add<float>, detail::Array<char*, 3>);
template void vectorized_elementwise_kernel<4, ReluFunctor<float>, detail::Array<char*, 2>>(
    int, ReluFunctor<float>, detail::Array<char*, 2>);
template void vectorized_elementwise_kernel<4, MulFunctor<float>, detail::Array<char*, 3>>(
    int, MulFunctor<float>, detail::Array<char*, 3>);

template <int nt, int output_vec_size, typename R>
TESTBED_EXPORT void reduce_kernel(R reduction) {
  g_mark = 30 + nt + output_vec_size + static_cast<int>(reduction.n);
}
template void reduce_kernel<512, 1, ReduceOp<float, func_wrapper_t<float>, unsigned int, float, 4>>(
    ReduceOp<float, func_wrapper_t<float>, unsigned int, float, 4>);

template <typename T, typename T_ACC>
TESTBED_EXPORT void vectorized_layer_norm_kernel(int N, T_ACC eps, const T* X, const T* gamma,
                                                 const T* beta, T_ACC* mean, T_ACC* rstd, T* Y) {
  g_mark = 40 + N + static_cast<int>(eps) + (X == Y) + (gamma == beta) + (mean == rstd);
}
template void vectorized_layer_norm_kernel<float, float>(int, float, const float*, const float*,
                                                         const float*, float*, float*, float*);

template <int ILP, typename scalar_t, typename accscalar_t, typename outscalar_t, typename Epilogue>
TESTBED_EXPORT void cunn_SoftMaxForward(outscalar_t* output, const scalar_t* input, int classes) {
  g_mark = 50 + ILP + classes + (static_cast<const void*>(output) == input);
}
template void cunn_SoftMaxForward<4, float, float, float, SoftMaxForwardEpilogue>(float*, const float*,
                                                                                 int);

template <typename scalar_t, typename index_t>
TESTBED_EXPORT void nll_loss_forward_reduce_cuda_kernel_2d(scalar_t* output, scalar_t* total_weight,
                                                           const scalar_t* input, const index_t* target,
                                                           const scalar_t* weights, bool size_average,
                                                           int64_t nframe, int64_t ndim,
                                                           int64_t n_classes, int64_t ignore_index) {
  g_mark = 60 + static_cast<int>(nframe + ndim + n_classes + ignore_index) + size_average +
           (output == total_weight) + (input == weights) + (target == nullptr);
}
template void nll_loss_forward_reduce_cuda_kernel_2d<float, long>(float*, float*, const float*,
                                                                  const long*, const float*, bool,
                                                                  int64_t, int64_t, int64_t, int64_t);

template <typename T, typename U>
TESTBED_EXPORT void multi_tensor_apply_kernel(T tl, U callable) {
  g_mark = 70 + static_cast<int>(sizeof(tl)) + static_cast<int>(callable.lr);
}
template void multi_tensor_apply_kernel<TensorListMetadata<4>, FusedAdamMathFunctor<float, 4>>(
    TensorListMetadata<4>, FusedAdamMathFunctor<float, 4>);
}  // namespace native
}  // namespace at

// ---- Lookup by a short role name, for programs that cannot spell mangled names (the Python rank
// program through ctypes, tests). Returns nullptr for an unknown name.
namespace {
struct KernelEntry {
  const char* role;
  const void* stub;
};
using at::detail::Array;
using namespace at::native;
const KernelEntry kKernels[] = {
    {"gemm_fwd", reinterpret_cast<const void*>(&ampere_sgemm_128x64_tn)},
    {"gemm_bwd_data", reinterpret_cast<const void*>(&ampere_sgemm_128x64_nn)},
    {"gemm_bwd_weight",
     reinterpret_cast<const void*>(
         &sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas)},
    {"gemm_small", reinterpret_cast<const void*>(&ampere_sgemm_64x64_nt)},
    {"cutlass_gemm", reinterpret_cast<const void*>(
                         &cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>)},
    {"add", reinterpret_cast<const void*>(
                &vectorized_elementwise_kernel<4, CUDAFunctor_add<float>, Array<char*, 3>>)},
    {"relu", reinterpret_cast<const void*>(
                 &vectorized_elementwise_kernel<4, ReluFunctor<float>, Array<char*, 2>>)},
    {"mul", reinterpret_cast<const void*>(
                &vectorized_elementwise_kernel<4, MulFunctor<float>, Array<char*, 3>>)},
    {"reduce_sum",
     reinterpret_cast<const void*>(
         &reduce_kernel<512, 1, ReduceOp<float, func_wrapper_t<float>, unsigned int, float, 4>>)},
    {"layer_norm", reinterpret_cast<const void*>(&vectorized_layer_norm_kernel<float, float>)},
    {"softmax", reinterpret_cast<const void*>(
                    &cunn_SoftMaxForward<4, float, float, float, SoftMaxForwardEpilogue>)},
    {"nll_loss", reinterpret_cast<const void*>(&nll_loss_forward_reduce_cuda_kernel_2d<float, long>)},
    {"adam", reinterpret_cast<const void*>(
                 &multi_tensor_apply_kernel<TensorListMetadata<4>, FusedAdamMathFunctor<float, 4>>)},
};
}  // namespace

extern "C" TESTBED_EXPORT const void* strata_testbed_kernel(const char* role) {
  if (role == nullptr) return nullptr;
  for (const auto& k : kKernels) {
    if (std::strcmp(k.role, role) == 0) return k.stub;
  }
  return nullptr;
}
