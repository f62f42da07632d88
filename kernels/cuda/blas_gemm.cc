#include "kernels/cuda/blas_gemm.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "kernels/cuda/cublas_api.h"
#include "kernels/cuda/cuda_status.h"

namespace kvd {
namespace {

// Largest power of two (<= 256) dividing the address: cuBLASLt's heuristic must not assume
// more alignment than the pointers have.
int Alignment(const void* ptr) {
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  int alignment = 1;
  while (alignment < 256 && address % (2 * alignment) == 0) alignment *= 2;
  return alignment;
}

}  // namespace

struct BlasGemm::Plan {
  const CublasApi* api = nullptr;
  bool use_lt = false;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr;  // weight, k x n column-major, op T
  cublasLtMatrixLayout_t b = nullptr;  // in, k x m column-major
  cublasLtMatrixLayout_t c = nullptr;  // out, n x m column-major
  cublasLtMatmulAlgo_t algo{};

  ~Plan() {
    if (c != nullptr) api->cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) api->cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) api->cublasLtMatrixLayoutDestroy(a);
    if (desc != nullptr) api->cublasLtMatmulDescDestroy(desc);
  }
};

absl::StatusOr<std::unique_ptr<BlasGemm>> BlasGemm::Create(cudaStream_t stream) {
  absl::StatusOr<const CublasApi*> loaded = LoadCublas();
  if (!loaded.ok()) return loaded.status();
  const CublasApi* const api = *loaded;
  cublasLtHandle_t lt = nullptr;
  KVD_RETURN_IF_CUBLAS_ERROR(api->cublasLtCreate(&lt), "BlasGemm: cublasLtCreate");
  cublasHandle_t blas = nullptr;
  if (absl::Status s = CublasStatus(api->cublasCreate(&blas), "BlasGemm: cublasCreate"); !s.ok()) {
    api->cublasLtDestroy(lt);
    return s;
  }
  int device = 0;
  int l2_bytes = 0;
  absl::Status s = CudaStatus(cudaGetDevice(&device), "BlasGemm: cudaGetDevice");
  if (s.ok()) {
    s = CudaStatus(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device),
                   "BlasGemm: L2 size");
  }
  void* workspace = nullptr;
  if (s.ok()) s = CudaStatus(cudaMalloc(&workspace, kWorkspaceBytes), "BlasGemm: workspace");
  if (s.ok()) s = CublasStatus(api->cublasSetStream(blas, stream), "BlasGemm: cublasSetStream");
  if (!s.ok()) {
    if (workspace != nullptr) cudaFree(workspace);
    api->cublasDestroy(blas);
    api->cublasLtDestroy(lt);
    return s;
  }
  return std::unique_ptr<BlasGemm>(new BlasGemm(api, stream, lt, blas, workspace, l2_bytes));
}

BlasGemm::BlasGemm(const CublasApi* api, cudaStream_t stream, cublasLtHandle_t lt,
                   cublasHandle_t blas, void* workspace, int l2_bytes)
    : api_(api),
      stream_(stream),
      lt_(lt),
      blas_(blas),
      workspace_(workspace),
      l2_bytes_(static_cast<size_t>(l2_bytes)) {}

BlasGemm::~BlasGemm() {
  plans_.clear();
  uses_.clear();
  cudaFree(workspace_);
  api_->cublasDestroy(blas_);
  api_->cublasLtDestroy(lt_);
}

absl::StatusOr<const BlasGemm::Plan*> BlasGemm::GetPlan(const PlanKey& key, const void* in,
                                                        const void* weight) {
  if (auto it = plans_.find(key); it != plans_.end()) {
    uses_.splice(uses_.begin(), uses_, it->second.use);
    return it->second.plan.get();
  }
  const auto [m, n, k, accumulate, align_in, align_weight, align_out] = key;
  auto plan = std::make_unique<Plan>();
  plan->api = api_;
  constexpr const char* kOp = "Matmul: cuBLASLt plan";
  KVD_RETURN_IF_CUBLAS_ERROR(
      api_->cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), kOp);
  const cublasOperation_t trans_a = CUBLAS_OP_T;
  const cublasOperation_t trans_b = CUBLAS_OP_N;
  KVD_RETURN_IF_CUBLAS_ERROR(
      api_->cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a,
                                           sizeof(trans_a)),
      kOp);
  KVD_RETURN_IF_CUBLAS_ERROR(
      api_->cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b,
                                           sizeof(trans_b)),
      kOp);
  KVD_RETURN_IF_CUBLAS_ERROR(api_->cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, k, n, k), kOp);
  KVD_RETURN_IF_CUBLAS_ERROR(api_->cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, k, m, k), kOp);
  KVD_RETURN_IF_CUBLAS_ERROR(api_->cublasLtMatrixLayoutCreate(&plan->c, CUDA_R_32F, n, m, n), kOp);

  cublasLtMatmulPreference_t pref = nullptr;
  KVD_RETURN_IF_CUBLAS_ERROR(api_->cublasLtMatmulPreferenceCreate(&pref), kOp);
  const uint64_t workspace_bytes = kWorkspaceBytes;
  const uint32_t aligns[4] = {static_cast<uint32_t>(align_weight), static_cast<uint32_t>(align_in),
                              static_cast<uint32_t>(align_out), static_cast<uint32_t>(align_out)};
  const cublasLtMatmulPreferenceAttributes_t align_attrs[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  cublasStatus_t status = api_->cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes, sizeof(workspace_bytes));
  for (int i = 0; i < 4 && status == CUBLAS_STATUS_SUCCESS; ++i) {
    status = api_->cublasLtMatmulPreferenceSetAttribute(pref, align_attrs[i], &aligns[i],
                                                        sizeof(aligns[i]));
  }
  static_assert(kTunedCandidates <= kMaxHeuristicRank + 1);
  cublasLtMatmulHeuristicResult_t results[kMaxHeuristicRank + 1] = {};
  // A weight that fits in the L2 twice over is left to its first choice: timed again and
  // again it would be read from the L2 (a decode step reads it from DRAM), and writing over
  // the L2 before each run leaves dirty lines whose write-back slows the run timed.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const bool tune = heuristic_rank_ == 0 && m <= tune_rows_ && size_t(n) * k * 2 >= 2 * l2_bytes_ &&
                    cudaStreamIsCapturing(stream_, &capture) == cudaSuccess &&
                    capture == cudaStreamCaptureStatusNone;
  const int wanted = tune ? kTunedCandidates : heuristic_rank_ + 1;
  int num_results = 0;
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = api_->cublasLtMatmulAlgoGetHeuristic(lt_, plan->desc, plan->a, plan->b, plan->c,
                                                  plan->c, pref, wanted, results, &num_results);
  }
  api_->cublasLtMatmulPreferenceDestroy(pref);
  heuristic_results_ = num_results;
  last_plan_rank_ = -1;
  if (status == CUBLAS_STATUS_SUCCESS && num_results >= (tune ? 1 : wanted)) {
    int rank = wanted - 1;
    if (tune) {
      absl::StatusOr<int> fastest = FastestCandidate(key, *plan, results, num_results, in, weight);
      if (!fastest.ok()) return fastest.status();
      rank = *fastest;
    }
    plan->use_lt = true;
    plan->algo = results[rank].algo;
    last_plan_rank_ = rank;
  } else if (status != CUBLAS_STATUS_SUCCESS && status != CUBLAS_STATUS_NOT_SUPPORTED) {
    return CublasStatus(status, kOp);
  }
  // Otherwise no cuBLASLt algorithm fits: Run takes the cublasGemmEx path.
  if (plans_.size() >= kMaxPlans) {
    plans_.erase(uses_.back());
    uses_.pop_back();
  }
  const Plan* raw = plan.get();
  uses_.push_front(key);
  plans_.emplace(key, CachedPlan{std::move(plan), uses_.begin()});
  return raw;
}

absl::StatusOr<int> BlasGemm::FastestCandidate(const PlanKey& key, const Plan& plan,
                                               const cublasLtMatmulHeuristicResult_t* results,
                                               int count, const void* in, const void* weight) {
  if (count < 2) return 0;
  const auto [m, n, k, accumulate, align_in, align_weight, align_out] = key;
  constexpr const char* kOp = "Matmul: timing cuBLASLt algorithms";
  // The output goes to scratch for the time of this call; a device too full for it keeps the
  // first choice.
  const size_t out_bytes = size_t(m) * n * sizeof(float);
  void* scratch = nullptr;
  if (cudaMalloc(&scratch, out_bytes) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: the device is only full
    return 0;
  }
  constexpr int kEvents = 2 * kTunedCandidates * kTunedRuns;
  cudaEvent_t events[kEvents] = {};
  absl::Cleanup release = [&] {
    for (cudaEvent_t e : events) {
      if (e != nullptr) cudaEventDestroy(e);
    }
    cudaFree(scratch);
  };
  for (cudaEvent_t& e : events) KVD_RETURN_IF_CUDA_ERROR(cudaEventCreate(&e), kOp);
  float* out = static_cast<float*>(scratch);
  KVD_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(out, 0, out_bytes, stream_), kOp);

  const float alpha = 1.0f;
  const float beta = accumulate ? 1.0f : 0.0f;
  auto launch = [&](int c) {
    return api_->cublasLtMatmul(lt_, plan.desc, &alpha, weight, plan.a, in, plan.b, &beta, out,
                                plan.c, out, plan.c, &results[c].algo, workspace_, kWorkspaceBytes,
                                stream_) == CUBLAS_STATUS_SUCCESS;
  };
  bool ran[kTunedCandidates] = {};
  for (int c = 0; c < count; ++c) {
    ran[c] = launch(c);  // once untimed: first-use costs out of the timing
    for (int r = 0; ran[c] && r < kTunedRuns; ++r) {
      cudaEvent_t* pair = &events[2 * (c * kTunedRuns + r)];
      KVD_RETURN_IF_CUDA_ERROR(cudaEventRecord(pair[0], stream_), kOp);
      ran[c] = launch(c);
      KVD_RETURN_IF_CUDA_ERROR(cudaEventRecord(pair[1], stream_), kOp);
    }
  }
  KVD_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), kOp);

  float fastest_ms[kTunedCandidates] = {};
  int best = -1;
  for (int c = 0; c < count; ++c) {
    if (!ran[c]) continue;
    fastest_ms[c] = std::numeric_limits<float>::infinity();
    for (int r = 0; r < kTunedRuns; ++r) {
      float ms = 0;
      const cudaEvent_t* pair = &events[2 * (c * kTunedRuns + r)];
      KVD_RETURN_IF_CUDA_ERROR(cudaEventElapsedTime(&ms, pair[0], pair[1]), kOp);
      fastest_ms[c] = std::min(fastest_ms[c], ms);
    }
    if (best < 0 || fastest_ms[c] < fastest_ms[best]) best = c;
  }
  if (best < 0) return 0;  // none ran: the Run reports the first one's error
  if (ran[0] && fastest_ms[best] * (1.0 + kTuneMargin) >= fastest_ms[0]) return 0;
  return best;
}

void BlasGemm::UseHeuristicRank(int rank) {
  heuristic_rank_ = std::clamp(rank, 0, kMaxHeuristicRank);
  plans_.clear();
  uses_.clear();
}

absl::Status BlasGemm::Run(float* out, const void* in, const void* weight, int m, int n, int k,
                           bool accumulate) {
  if (m == 0) return absl::OkStatus();
  const PlanKey key{m, n, k, accumulate, Alignment(in), Alignment(weight), Alignment(out)};
  absl::StatusOr<const Plan*> plan = GetPlan(key, in, weight);
  if (!plan.ok()) return plan.status();
  const float alpha = 1.0f;
  const float beta = accumulate ? 1.0f : 0.0f;
  if ((*plan)->use_lt) {
    KVD_RETURN_IF_CUBLAS_ERROR(
        api_->cublasLtMatmul(lt_, (*plan)->desc, &alpha, weight, (*plan)->a, in, (*plan)->b, &beta,
                             out, (*plan)->c, out, (*plan)->c, &(*plan)->algo, workspace_,
                             kWorkspaceBytes, stream_),
        "Matmul: cublasLtMatmul");
    return absl::OkStatus();
  }
  KVD_RETURN_IF_CUBLAS_ERROR(
      api_->cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, weight, CUDA_R_16BF, k,
                         in, CUDA_R_16BF, k, &beta, out, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT),
      "Matmul: cublasGemmEx");
  return absl::OkStatus();
}

}  // namespace kvd
