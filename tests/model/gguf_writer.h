#ifndef KVD_TESTS_MODEL_GGUF_WRITER_H_
#define KVD_TESTS_MODEL_GGUF_WRITER_H_

// Test support: GGUF files built in memory, valid or broken on purpose (the writer checks
// nothing), for the GGUF reader's and loader's tests.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvd::test {

class GgufWriter {
 public:
  void AddUint32(const std::string& key, uint32_t value);
  void AddInt32(const std::string& key, int32_t value);
  void AddFloat32(const std::string& key, float value);
  void AddString(const std::string& key, const std::string& value);
  void AddStrings(const std::string& key, const std::vector<std::string>& values);
  void AddFloats(const std::string& key, const std::vector<float>& values);
  void AddInt32s(const std::string& key, const std::vector<int32_t>& values);
  // A value of any type given as its type number and raw bytes.
  void AddRaw(const std::string& key, uint32_t type, const std::string& value_bytes);

  // A tensor of ggml `type` whose data are `data` (raw bytes). Tensors are laid out in the
  // order added, each at the next multiple of the alignment, unless `offset` says where.
  void AddTensor(const std::string& name, const std::vector<uint64_t>& dims, uint32_t type,
                 const std::string& data, std::optional<uint64_t> offset = std::nullopt);

  // The file: version, alignment (general.alignment is written only if added as a key).
  std::string Bytes(uint32_t version = 3, uint64_t alignment = 32) const;
  // Writes Bytes() to a file under the test temp dir and returns its path.
  std::string WriteTemp(const std::string& name, uint32_t version = 3) const;

  // Raw little-endian bytes of fp32 values, and of fp16 and bf16 bit patterns.
  static std::string F32(const std::vector<float>& values);
  static std::string U16(const std::vector<uint16_t>& bits);

 private:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type;
    std::string data;
    std::optional<uint64_t> offset;
  };
  std::vector<std::pair<std::string, std::string>> metadata_;  // key, type + value bytes
  std::vector<Tensor> tensors_;
};

// A small llama in GGUF, F32 unless `type` says BF16: 2 layers, dim 8, 2 heads of 4, 1 KV
// head, hidden 12, vocabulary 16, context 64, rope.freq_base 500000, RMS epsilon 1e-6, no
// tokenizer. Tensor values are distinct: tensor k (in the order token_embd, output_norm,
// output, then each layer's attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm,
// ffn_gate, ffn_down, ffn_up) holds k + i / 1024 at element i.
struct TinyLlamaGguf {
  uint32_t type = 0;        // ggml F32 (0) or BF16 (30)
  bool with_output = true;  // false: no output.weight (a shared classifier)
  std::string drop;         // a tensor left out
  std::string reshape;      // a tensor given dims {3}
  std::string architecture = "llama";
  bool write_head_count_kv = true;
  float rope_theta = 500000.0f;
  std::string int8_tensor;  // a tensor stored as ggml I8 (zeros)

  GgufWriter Writer() const;
};

}  // namespace kvd::test

#endif  // KVD_TESTS_MODEL_GGUF_WRITER_H_
