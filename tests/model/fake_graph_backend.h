#ifndef KVD_TESTS_MODEL_FAKE_GRAPH_BACKEND_H_
#define KVD_TESTS_MODEL_FAKE_GRAPH_BACKEND_H_

// FakeGraphBackend: the CPU reference backend with what LlamaModel's decode graphs need from
// a device backend, for host-only tests of them:
//   - graphs (FakeGraphRecorder): between BeginCapture and EndCapture ops are recorded with
//     their parameters, not run; copies and waits fail; Launch runs the recorded ops again
//     with the same addresses, as a CUDA graph does;
//   - memory the model frees is kept (quarantined), so that a graph that still holds its
//     address is caught: Launch fails naming the op instead of touching freed memory;
//   - FailAllocation(n) makes the n-th next Allocate fail with ResourceExhausted, as a full
//     device would.
// Not thread safe, as every Backend. Buffers must be freed (the model destroyed) before it.

#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/backend.h"
#include "kernels/cpu_backend.h"
#include "model/llama_model.h"

namespace kvd::test {

class FakeGraphBackend final : public Backend {
 public:
  // One op as recorded: how to run it again, and the backend memory its pointers name.
  struct RecordedOp {
    std::string name;
    std::function<absl::Status()> run;
    std::vector<const void*> pointers;
  };

  FakeGraphBackend() = default;

  // The allocation `n` calls from now (0: the next one) fails once.
  void FailAllocation(int64_t n) { fail_at_ = num_allocations_ + n; }
  int64_t num_allocations() const { return num_allocations_; }

  // Whether `p` lies in memory Allocate gave out and that is not freed yet.
  bool IsLive(const void* p) const {
    const uintptr_t at = reinterpret_cast<uintptr_t>(p);
    auto it = blocks_.upper_bound(at);
    if (it == blocks_.begin()) return false;
    --it;
    return it->second.live && at < it->first + it->second.memory.bytes();
  }

  absl::Status BeginCapture() {
    if (capturing_) return absl::FailedPreconditionError("BeginCapture: already capturing");
    capturing_ = true;
    recorded_.clear();
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<RecordedOp>> EndCapture() {
    if (!capturing_) return absl::FailedPreconditionError("EndCapture: not capturing");
    capturing_ = false;
    return std::exchange(recorded_, {});
  }
  // Runs recorded ops, after checking that every pointer they hold is still live.
  absl::Status Launch(const std::vector<RecordedOp>& ops) {
    for (const RecordedOp& op : ops) {
      for (const void* p : op.pointers) {
        if (p != nullptr && !IsLive(p)) {
          return absl::FailedPreconditionError(absl::StrCat("replayed graph: ", op.name,
                                                            " uses freed memory at ",
                                                            reinterpret_cast<uintptr_t>(p)));
        }
      }
    }
    for (const RecordedOp& op : ops) {
      if (absl::Status s = op.run(); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  std::string_view name() const override { return "fake-graph-cpu"; }
  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) override {
    if (num_allocations_++ == fail_at_) {
      return absl::ResourceExhaustedError(absl::StrCat("injected: Allocate(", bytes, ")"));
    }
    auto memory = inner_.Allocate(bytes);
    if (!memory.ok() || bytes == 0) return memory;
    void* data = memory->data();
    blocks_[reinterpret_cast<uintptr_t>(data)] = Block{*std::move(memory), true};
    return DeviceBuffer(this, data, bytes);
  }
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) override {
    if (capturing_) return absl::FailedPreconditionError("CopyToDevice while capturing");
    return inner_.CopyToDevice(dst, src, bytes);
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    if (capturing_) return absl::FailedPreconditionError("CopyToHost while capturing");
    return inner_.CopyToHost(dst, src, bytes);
  }
  absl::Status Synchronize() override {
    if (capturing_) return absl::FailedPreconditionError("Synchronize while capturing");
    return absl::OkStatus();
  }
  DType weight_dtype() const override { return DType::kF32; }
  absl::StatusOr<DeviceBuffer> UploadWeights(const float* host, size_t count) override {
    auto buffer = Allocate(count * sizeof(float));
    if (buffer.ok() && count > 0) std::memcpy(buffer->data(), host, count * sizeof(float));
    return buffer;
  }

  absl::Status Embedding(const EmbeddingParams& p) override {
    return Op("Embedding", &CpuBackend::Embedding, p, {p.out, p.table, p.token_ids});
  }
  absl::Status RmsNorm(const RmsNormParams& p) override {
    return Op("RmsNorm", &CpuBackend::RmsNorm, p, {p.out, p.in, p.weight});
  }
  absl::Status Matmul(const MatmulParams& p) override {
    return Op("Matmul", &CpuBackend::Matmul, p, {p.out, p.in, p.weight, p.norm_weight, p.up});
  }
  absl::Status Rope(const RopeParams& p) override {
    return Op("Rope", &CpuBackend::Rope, p, {p.q, p.k, p.positions, p.v, p.slot_mapping});
  }
  absl::Status SiluMul(const SiluMulParams& p) override {
    return Op("SiluMul", &CpuBackend::SiluMul, p, {p.out, p.gate, p.up});
  }
  absl::Status AppendKv(const AppendKvParams& p) override {
    return Op("AppendKv", &CpuBackend::AppendKv, p, {p.k, p.v, p.slot_mapping});
  }
  absl::Status PagedAttention(const PagedAttentionParams& p) override {
    return Op("PagedAttention", &CpuBackend::PagedAttention, p,
              {p.out, p.q, p.q_indptr, p.blocks.indptr, p.blocks.indices, p.blocks.last_block_len});
  }
  absl::Status CopyBlocks(const CopyBlocksParams& p) override {
    return Op("CopyBlocks", &CpuBackend::CopyBlocks, p, {p.src, p.dst});
  }
  absl::Status Sample(const SampleParams& p) override {
    return Op("Sample", &CpuBackend::Sample, p, {p.logits, p.rows, p.out_tokens});
  }

 protected:
  void Free(void* data, size_t /*bytes*/) override {
    blocks_[reinterpret_cast<uintptr_t>(data)].live = false;  // kept until the backend dies
  }

 private:
  struct Block {
    DeviceBuffer memory;  // from inner_
    bool live = false;
  };

  // Runs the op, or records it while capturing.
  template <typename Params>
  absl::Status Op(const char* name, absl::Status (CpuBackend::*op)(const Params&), const Params& p,
                  std::initializer_list<const void*> pointers) {
    if (!capturing_) return (inner_.*op)(p);
    recorded_.push_back({name, [this, op, p] { return (inner_.*op)(p); }, pointers});
    return absl::OkStatus();
  }

  CpuBackend inner_{1};  // declared first: outlives blocks_
  std::map<uintptr_t, Block> blocks_;
  int64_t num_allocations_ = 0;
  int64_t fail_at_ = -1;
  bool capturing_ = false;
  std::vector<RecordedOp> recorded_;
};

// OpGraphRecorder over FakeGraphBackend. Its epoch never changes: the CPU ops keep no
// scratch of their own.
class FakeGraphRecorder final : public OpGraphRecorder {
 public:
  explicit FakeGraphRecorder(FakeGraphBackend* backend) : backend_(backend) {}

  absl::Status BeginCapture() override { return backend_->BeginCapture(); }
  absl::StatusOr<std::unique_ptr<Graph>> EndCapture() override {
    auto ops = backend_->EndCapture();
    if (!ops.ok()) return ops.status();
    return std::unique_ptr<Graph>(new RecordedGraph(backend_, *std::move(ops)));
  }
  uint64_t epoch() const override { return 0; }

 private:
  class RecordedGraph final : public Graph {
   public:
    RecordedGraph(FakeGraphBackend* backend, std::vector<FakeGraphBackend::RecordedOp> ops)
        : backend_(backend), ops_(std::move(ops)) {}
    absl::Status Launch() override { return backend_->Launch(ops_); }

   private:
    FakeGraphBackend* backend_;
    std::vector<FakeGraphBackend::RecordedOp> ops_;
  };

  FakeGraphBackend* backend_;
};

}  // namespace kvd::test

#endif  // KVD_TESTS_MODEL_FAKE_GRAPH_BACKEND_H_
