#include "kernels/cuda/blas_gemm.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "kernels/cuda/cublas_api.h"
#include "kernels/cuda/cuda_status.h"

namespace kvd {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

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
  void* workspace = nullptr;
  absl::Status s = CudaStatus(cudaMalloc(&workspace, kWorkspaceBytes), "BlasGemm: workspace");
  if (s.ok()) s = CublasStatus(api->cublasSetStream(blas, stream), "BlasGemm: cublasSetStream");
  if (!s.ok()) {
    if (workspace != nullptr) cudaFree(workspace);
    api->cublasDestroy(blas);
    api->cublasLtDestroy(lt);
    return s;
  }
  return std::unique_ptr<BlasGemm>(new BlasGemm(api, stream, lt, blas, workspace));
}

BlasGemm::BlasGemm(const CublasApi* api, cudaStream_t stream, cublasLtHandle_t lt,
                   cublasHandle_t blas, void* workspace)
    : api_(api), stream_(stream), lt_(lt), blas_(blas), workspace_(workspace) {}

BlasGemm::~BlasGemm() {
  plans_.clear();
  uses_.clear();
  cudaFree(workspace_);
  api_->cublasDestroy(blas_);
  api_->cublasLtDestroy(lt_);
}

absl::StatusOr<const BlasGemm::Plan*> BlasGemm::GetPlan(const PlanKey& key) {
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
  cublasLtMatmulHeuristicResult_t results[kMaxHeuristicRank + 1] = {};
  const int wanted = heuristic_rank_ + 1;
  int num_results = 0;
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = api_->cublasLtMatmulAlgoGetHeuristic(lt_, plan->desc, plan->a, plan->b, plan->c,
                                                  plan->c, pref, wanted, results, &num_results);
  }
  api_->cublasLtMatmulPreferenceDestroy(pref);
  heuristic_results_ = num_results;
  if (status == CUBLAS_STATUS_SUCCESS && num_results >= wanted) {
    plan->use_lt = true;
    plan->algo = results[wanted - 1].algo;
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

void BlasGemm::UseHeuristicRank(int rank) {
  heuristic_rank_ = std::clamp(rank, 0, kMaxHeuristicRank);
  plans_.clear();
  uses_.clear();
}

absl::Status BlasGemm::Run(float* out, const void* in, const void* weight, int m, int n, int k,
                           bool accumulate) {
  if (m == 0) return absl::OkStatus();
  const PlanKey key{m, n, k, accumulate, Alignment(in), Alignment(weight), Alignment(out)};
  absl::StatusOr<const Plan*> plan = GetPlan(key);
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
