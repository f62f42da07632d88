#ifndef KVD_KERNELS_CUDA_BLAS_GEMM_H_
#define KVD_KERNELS_CUDA_BLAS_GEMM_H_

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <list>
#include <map>
#include <memory>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvd {

struct CublasApi;

// BlasGemm computes out[m][n] = in[m][:] . weight[n][:] (+ out[m][n] when accumulating) with
// bf16 `in` and `weight`, fp32 `out` and fp32 accumulation, on one stream.
//
// Row-major out[m][n] is column-major out^T (n x m), so each call is the column-major
// product  out^T = weight^T(op T, stored k x n) * in^T (stored k x m): cuBLAS's "TN" case.
// cuBLASLt runs it with a plan (descriptors + heuristic algorithm) cached per shape,
// accumulate flag and pointer alignment, the kMaxPlans used last; where cuBLASLt offers no
// algorithm (odd shapes or alignments) the call falls back to cublasGemmEx.
//
// Products of few rows (decode batches) are bound by reading the weight, and there the
// heuristic's first algorithm is often not its fastest (H200, 64 rows, from graphs: it reads
// 0.70-0.89 of copy bandwidth, the best of its first eight up to 9% more); TuneUpTo has such
// plans chosen by timing instead.
//
// Two kernels of our own for 9-64 rows were measured against it and not kept (H200,
// gpu_bench gemv, from graphs, fraction of copy bandwidth at 64 rows for qkv / o / gate_up /
// down / lm_head, against the tuned cuBLAS plans' 0.74-0.75 / 0.71 / 0.92 / 0.78-0.80 /
// 0.94-0.95; the best of the split counts tried):
//   - the skinny kernel's layout (gemv_kernels.h) widened: weights streamed into mma.sync
//     registers, eight warps on 16 or 32 weight rows each, the input rows read through L1,
//     k split over CTAs with partial tiles merged by the last to arrive: 0.39 / 0.31 / 0.58 /
//     0.47 / 0.58 (at 16 rows 0.72 / 0.65 / 0.76 / 0.85 / 0.98, against cuBLAS's 0.77 / 0.63 /
//     0.97 / 0.87 / 0.97). Loads and products share each warp, so while a warp runs an
//     iteration's products (four times as many at 64 rows as at 16) its next weight loads
//     wait, presumably why it slows as rows are added.
//   - Hopper's design: a producer warp copying 64-wide k tiles of 128 or 256 weight rows and
//     of the input (tensor maps) into a ring of ~200 KB that two wgmma warpgroups consume, the
//     first stages' weight copied before the wait for the kernel before (launch.cuh), one CTA
//     per multiprocessor, in a plain grid and then persistent: 0.67 / 0.52 / 0.88 / 0.79 /
//     0.90. Unsplit it streams well where the row blocks fill the device (lm_head: 0.90 with
//     its 501 blocks of 256 rows taking four rounds of 132 multiprocessors for 3.8), but
//     the smaller products need k split, and each split's partial tile (64 fp32 per weight
//     row, written and merged) and the wait for the last arrival cost about what the split
//     gains: qkv's and o's 48 and 32 blocks of 128 rows leave most multiprocessors idle
//     unsplit (0.63, 0.44), and split they gain little (o 0.52 in four) or lose (qkv 0.59
//     in two).
// So decode batches past the skinny kernel's eight rows stay on cuBLAS. Nor does cuBLASLt
// hold much better configurations than its heuristic's first eight (H200, 64 rows, graphs of
// 16 calls over rotating weight copies, fraction of copy bandwidth; a harness of its own,
// not kept, whose figures for the same algorithms run up to 8% below gpu_bench gemv's above,
// so they compare among themselves): over every tile (634),
// nine cluster shapes and split-k 1-4 of the one algorithm it offers (id 66), qkv's best read
// 0.741 against the heuristic's best 0.724, o's and gate_up's none more (0.666, 0.891 against
// 0.669, 0.895). Only down gains, from split-k variants of the heuristic's candidates: 0.851
// unsplit against 0.798 for its best, which splits k in two (its others split in three to
// six; two of them read 0.79-0.80 in two). Built into TuneUpTo later (each candidate that
// splits k timed beside its variant with k unsplit, CUBLASLT_ALGO_CONFIG_SPLITK_NUM = 1, as
// cublasLtMatmulAlgoCheck accepted), that gain did not show with the heuristic's own
// candidates: at 64 rows every unsplit variant of down read less than the algorithm it came
// from (H200, gpu_bench gemv from graphs: 0.49-0.73 of copy against 0.72-0.81, where the
// heuristic's first eight split k in two to six); of qkv's and o's eleven candidates that
// split k, most read more unsplit, but none beat the first choice, which does not split
// (qkv 0.74, o 0.71);
// kvd bench graphs on, three rounds alternating builds: 64 x 1k 7.124-7.188 ms a step
// against 7.151-7.177, 64 x 4k 12.873-12.949 against 12.886-12.942. Not kept.
//
// Owns its handles and a 32 MiB cuBLASLt workspace. Not thread safe: one engine thread.
// Create loads cuBLAS (LoadCublas) on the process's first call, and fails as that does when
// the libraries are missing.
class BlasGemm {
 public:
  // REQUIRES: the current device is the one `stream` belongs to.
  static absl::StatusOr<std::unique_ptr<BlasGemm>> Create(cudaStream_t stream);
  ~BlasGemm();
  BlasGemm(const BlasGemm&) = delete;
  BlasGemm& operator=(const BlasGemm&) = delete;

  // The cuBLASLt workspace each BlasGemm allocates at Create and holds to its end.
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  // Enqueues the product on the stream. REQUIRES: device pointers; in is [m][k] bf16,
  // weight [n][k] bf16, out [m][n] fp32; m >= 0, n > 0, k > 0.
  absl::Status Run(float* out, const void* in, const void* weight, int m, int n, int k,
                   bool accumulate);

  // Plans kept: m takes every batch token count, so an unbounded cache would grow to a plan
  // per (count, weight shape) over a long run. Past the bound the least recently used goes.
  static constexpr size_t kMaxPlans = 4096;
  size_t num_plans() const { return plans_.size(); }

  // Benchmark only (gpu_bench): plans made from now on take the cuBLASLt heuristic's
  // algorithm of rank `rank` (0, the default, is its first choice; ranks past
  // kMaxHeuristicRank are taken as it; the cached plans are dropped). A plan whose heuristic
  // offers no algorithm of that rank runs cublasGemmEx; heuristic_results() says how many it
  // offered for the last plan made (at most rank + 1).
  static constexpr int kMaxHeuristicRank = 15;
  void UseHeuristicRank(int rank);
  int heuristic_results() const { return heuristic_results_; }

  // Plans made from now on for products of 1 to `rows` rows (0, the default: none) whose
  // weight is at least twice the L2's size take the fastest of the heuristic's first
  // kTunedCandidates algorithms, timed on the operands of the Run that makes the plan: each
  // candidate runs once, then kTunedRuns times into a scratch output (`out` is written once,
  // by the chosen algorithm), and its fastest run counts; the first choice stays unless
  // another is faster by kTuneMargin. Smaller weights keep the first choice (timed repeatedly
  // they would be read from the L2). That Run synchronizes the stream and allocates the
  // scratch for the time of it; a plan made while the stream captures a graph, or when the
  // scratch cannot be had, takes the first choice untimed. Timings vary, so two processes may
  // choose differently, and their sums then differ in fp32 rounding; a process keeps each
  // plan's choice while the plan is cached. Ignored while UseHeuristicRank names a rank
  // other than 0.
  static constexpr int kTunedCandidates = 8;
  static constexpr int kTunedRuns = 3;
  static constexpr double kTuneMargin = 0.02;
  void TuneUpTo(int rows) { tune_rows_ = rows; }
  // The heuristic rank of the algorithm the last plan made runs (-1: cublasGemmEx).
  int last_plan_rank() const { return last_plan_rank_; }

 private:
  struct Plan;
  // (m, n, k, accumulate, alignment of in, weight and out in bytes, up to 256)
  using PlanKey = std::tuple<int, int, int, bool, int, int, int>;

  BlasGemm(const CublasApi* api, cudaStream_t stream, cublasLtHandle_t lt, cublasHandle_t blas,
           void* workspace, int l2_bytes);
  // The plan for `key`, made on first use (timing candidates on these operands, TuneUpTo).
  absl::StatusOr<const Plan*> GetPlan(const PlanKey& key, const void* in, const void* weight);
  // The index in [0, count) of the fastest of `results` (first-choice margin applied), timed
  // as TuneUpTo says for a plan GetPlan found worth timing; 0 when there is no scratch to time
  // with.
  absl::StatusOr<int> FastestCandidate(const PlanKey& key, const Plan& plan,
                                       const cublasLtMatmulHeuristicResult_t* results, int count,
                                       const void* in, const void* weight);

  const CublasApi* api_;  // LoadCublas's
  cudaStream_t stream_;
  cublasLtHandle_t lt_;
  cublasHandle_t blas_;
  void* workspace_;
  size_t l2_bytes_;  // the device's L2 size (TuneUpTo times weights of twice this or more)
  struct CachedPlan {
    std::unique_ptr<Plan> plan;
    std::list<PlanKey>::iterator use;  // its place in uses_
  };
  std::map<PlanKey, CachedPlan> plans_;
  std::list<PlanKey> uses_;  // the keys of plans_, most recently used first
  int heuristic_rank_ = 0;
  int heuristic_results_ = 0;
  int tune_rows_ = 0;
  int last_plan_rank_ = -1;
};

}  // namespace kvd

#endif  // KVD_KERNELS_CUDA_BLAS_GEMM_H_
