#include "model/llama2c_loader.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <new>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "model/regular_file.h"

namespace kvd {

namespace {

static_assert(std::endian::native == std::endian::little,
              "llama2.c checkpoints are little-endian; a big-endian host needs byte swaps");

constexpr uint32_t kVersionedMagic = 0x616b3432;  // "ak42"
constexpr int64_t kV0HeaderBytes = 7 * sizeof(int32_t);
constexpr int64_t kV1HeaderBytes = 256;
// uint32 magic + int32 version + 7 int32 params + uint8 shared flag.
constexpr int64_t kV1UsedHeaderBytes = 2 * sizeof(int32_t) + kV0HeaderBytes + 1;

// Far above any real Llama, low enough that header arithmetic stays well inside int64
// (largest tensor: 2^10 layers * 2^18 * 2^16 floats = 2^44 floats).
constexpr int64_t kMaxDim = 1 << 16;
constexpr int64_t kMaxHiddenDim = 1 << 18;
constexpr int64_t kMaxLayers = 1 << 10;
constexpr int64_t kMaxHeads = 1 << 10;
constexpr int64_t kMaxVocab = 1 << 22;
constexpr int64_t kMaxSeqLen = 1 << 22;

// The seven int32 values every version stores, in file order.
struct RawParams {
  int32_t dim;
  int32_t hidden_dim;
  int32_t n_layers;
  int32_t n_heads;
  int32_t n_kv_heads;
  int32_t vocab_size;
  int32_t seq_len;
};
static_assert(sizeof(RawParams) == kV0HeaderBytes);

// What the header says about the rest of the file.
struct Header {
  int32_t version = 0;
  int64_t header_bytes = 0;
  ModelSpec spec;
};

// One contiguous run of floats in the file: read into *dest, or skipped when dest is null.
struct Segment {
  std::vector<float>* dest;
  int64_t num_floats;
  std::string name;  // the tensor, e.g. "layers[3].wq" (empty for skipped bytes)
};

std::string Where(const std::string& path) { return absl::StrCat("llama2.c checkpoint ", path); }

int32_t ReadI32(const unsigned char* bytes) {
  int32_t value;
  std::memcpy(&value, bytes, sizeof(value));
  return value;
}

absl::Status CheckRange(const std::string& path, const char* field, int64_t value, int64_t max) {
  if (value <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(path), ": header field ", field, " must be positive, got ", value));
  }
  if (value > max) {
    return absl::InvalidArgumentError(absl::StrCat(Where(path), ": header field ", field, " = ",
                                                   value, " exceeds the sanity limit ", max,
                                                   " (corrupt header?)"));
  }
  return absl::OkStatus();
}

// Validates the seven params and turns them into a spec. `vocab_size` is already made
// positive by the caller.
absl::StatusOr<ModelSpec> SpecFromParams(const std::string& path, const RawParams& p,
                                         int64_t vocab_size, bool shared_classifier) {
  for (auto [field, value, max] : {std::tuple<const char*, int64_t, int64_t>{"dim", p.dim, kMaxDim},
                                   {"hidden_dim", p.hidden_dim, kMaxHiddenDim},
                                   {"n_layers", p.n_layers, kMaxLayers},
                                   {"n_heads", p.n_heads, kMaxHeads},
                                   {"n_kv_heads", p.n_kv_heads, kMaxHeads},
                                   {"vocab_size", vocab_size, kMaxVocab},
                                   {"seq_len", p.seq_len, kMaxSeqLen}}) {
    if (absl::Status s = CheckRange(path, field, value, max); !s.ok()) return s;
  }
  if (p.dim % p.n_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(path), ": dim (", p.dim, ") is not a multiple of n_heads (", p.n_heads, ")"));
  }
  if (p.n_heads % p.n_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(Where(path), ": n_heads (", p.n_heads,
                                                   ") is not a multiple of n_kv_heads (",
                                                   p.n_kv_heads, ")"));
  }
  const int32_t head_dim = p.dim / p.n_heads;
  if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(path), ": head_dim = dim / n_heads = ", head_dim, " must be even for RoPE"));
  }
  ModelSpec spec;
  spec.name = std::filesystem::path(path).stem().string();
  spec.num_layers = p.n_layers;
  spec.dim = p.dim;
  spec.hidden_dim = p.hidden_dim;
  spec.num_heads = p.n_heads;
  spec.num_kv_heads = p.n_kv_heads;
  spec.head_dim = head_dim;
  spec.vocab_size = static_cast<int32_t>(vocab_size);
  spec.max_context_tokens = p.seq_len;
  spec.rope_theta = 10000.0f;
  spec.rope_style = RopeStyle::kInterleaved;
  spec.norm_eps = 1e-5f;
  spec.shared_classifier = shared_classifier;
  spec.bos_token_id = 1;
  spec.eos_token_id = 2;
  spec.ends_at_bos = true;
  if (absl::Status s = spec.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(Where(path), ": ", s.message()));
  }
  return spec;
}

absl::Status Truncated(const std::string& path, int64_t needed, int64_t actual) {
  return absl::DataLossError(absl::StrCat(Where(path), ": truncated header: expected at least ",
                                          needed, " bytes, file has ", actual));
}

// Parses the header from the first bytes of a file of `file_bytes` bytes.
absl::StatusOr<Header> ParseHeader(const std::string& path, const unsigned char* bytes,
                                   int64_t file_bytes) {
  if (file_bytes == 0) return absl::DataLossError(absl::StrCat(Where(path), ": file is empty"));
  if (file_bytes >= 4 && std::memcmp(bytes, "GGUF", 4) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is a GGUF file, not a llama2.c checkpoint"));
  }
  Header header;
  RawParams params;
  bool shared = true;
  int64_t vocab_size = 0;
  if (file_bytes >= 4 && static_cast<uint32_t>(ReadI32(bytes)) == kVersionedMagic) {
    if (file_bytes < 8) return Truncated(path, kV1HeaderBytes, file_bytes);
    header.version = ReadI32(bytes + 4);
    if (header.version == 2) {
      return absl::UnimplementedError(absl::StrCat(
          Where(path), ": version 2 (int8 quantized) is not supported; export version 1 (fp32)"));
    }
    if (header.version != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(path), ": unsupported checkpoint version ", header.version,
                       " (supported: 0 = legacy, 1 = fp32)"));
    }
    if (file_bytes < kV1HeaderBytes) return Truncated(path, kV1HeaderBytes, file_bytes);
    std::memcpy(&params, bytes + 8, sizeof(params));
    const uint8_t shared_flag = bytes[kV1UsedHeaderBytes - 1];
    if (shared_flag > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(path), ": shared_classifier flag must be 0 or 1, got ", int{shared_flag}));
    }
    shared = shared_flag == 1;
    vocab_size = params.vocab_size;
    header.header_bytes = kV1HeaderBytes;
  } else {
    if (file_bytes < kV0HeaderBytes) return Truncated(path, kV0HeaderBytes, file_bytes);
    std::memcpy(&params, bytes, sizeof(params));
    // Widen before negating: -INT32_MIN overflows int32.
    vocab_size = params.vocab_size;
    shared = vocab_size > 0;
    if (vocab_size < 0) vocab_size = -vocab_size;
    header.version = 0;
    header.header_bytes = kV0HeaderBytes;
  }
  absl::StatusOr<ModelSpec> spec = SpecFromParams(path, params, vocab_size, shared);
  if (!spec.ok()) return spec.status();
  header.spec = *std::move(spec);
  return header;
}

// The file's float runs after the header, in order. Pointers go into `w`, whose `layers`
// must already hold spec.num_layers entries.
std::vector<Segment> Layout(const Header& header, ModelWeights& w) {
  const ModelSpec& s = header.spec;
  const int64_t dim = s.dim;
  const int64_t q_dim = int64_t{s.num_heads} * s.head_dim;
  const int64_t kv_dim = int64_t{s.num_kv_heads} * s.head_dim;
  const int64_t hidden = s.hidden_dim;
  const int64_t embed = int64_t{s.vocab_size} * dim;

  std::vector<Segment> segments;
  auto per_layer = [&](std::vector<float> LayerWeights::*field, const char* name,
                       int64_t num_floats) {
    for (size_t l = 0; l < w.layers.size(); ++l) {
      segments.push_back(
          {&(w.layers[l].*field), num_floats, absl::StrCat("layers[", l, "].", name)});
    }
  };
  if (header.version == 0) {
    segments.push_back({&w.token_embedding, embed, "token_embedding"});
    per_layer(&LayerWeights::attn_norm, "attn_norm", dim);
    per_layer(&LayerWeights::wq, "wq", q_dim * dim);
    per_layer(&LayerWeights::wk, "wk", kv_dim * dim);
    per_layer(&LayerWeights::wv, "wv", kv_dim * dim);
    per_layer(&LayerWeights::wo, "wo", dim * q_dim);
    per_layer(&LayerWeights::ffn_norm, "ffn_norm", dim);
    per_layer(&LayerWeights::w1, "w1", hidden * dim);
    per_layer(&LayerWeights::w2, "w2", dim * hidden);
    per_layer(&LayerWeights::w3, "w3", hidden * dim);
    segments.push_back({&w.final_norm, dim, "final_norm"});
    // freq_cis_real and freq_cis_imag, [seq_len][head_dim / 2] each.
    segments.push_back({nullptr, 2 * int64_t{s.max_context_tokens} * (s.head_dim / 2), ""});
  } else {
    per_layer(&LayerWeights::attn_norm, "attn_norm", dim);
    per_layer(&LayerWeights::ffn_norm, "ffn_norm", dim);
    segments.push_back({&w.final_norm, dim, "final_norm"});
    segments.push_back({&w.token_embedding, embed, "token_embedding"});
    per_layer(&LayerWeights::wq, "wq", q_dim * dim);
    per_layer(&LayerWeights::wk, "wk", kv_dim * dim);
    per_layer(&LayerWeights::wv, "wv", kv_dim * dim);
    per_layer(&LayerWeights::wo, "wo", dim * q_dim);
    per_layer(&LayerWeights::w1, "w1", hidden * dim);
    per_layer(&LayerWeights::w2, "w2", dim * hidden);
    per_layer(&LayerWeights::w3, "w3", hidden * dim);
  }
  if (!s.shared_classifier) segments.push_back({&w.classifier, embed, "classifier"});
  return segments;
}

int64_t ExpectedBytes(const Header& header, const std::vector<Segment>& segments) {
  int64_t bytes = header.header_bytes;
  for (const Segment& segment : segments) bytes += segment.num_floats * int64_t{sizeof(float)};
  return bytes;
}

// An open checkpoint whose header parsed and whose size matches it.
struct CheckedFile {
  std::ifstream stream;
  Header header;
  ModelWeights weights;  // spec set, layers sized, tensors still empty
  std::vector<Segment> segments;
};

absl::Status OpenAndCheck(const std::string& path, CheckedFile& file) {
  const absl::StatusOr<int64_t> size = RegularFileSize(path, Where(path));
  if (!size.ok()) return size.status();
  const int64_t file_bytes = *size;

  errno = 0;
  file.stream.open(path, std::ios::binary);
  if (!file.stream) return CannotOpen(Where(path), errno);
  unsigned char head[kV1HeaderBytes] = {};
  const int64_t head_bytes = std::min<int64_t>(file_bytes, kV1HeaderBytes);
  if (!file.stream.read(reinterpret_cast<char*>(head), head_bytes)) {
    return absl::DataLossError(absl::StrCat(Where(path), ": read of the header failed"));
  }
  absl::StatusOr<Header> header = ParseHeader(path, head, file_bytes);
  if (!header.ok()) return header.status();
  file.header = *std::move(header);

  file.weights.spec = file.header.spec;
  file.weights.layers.resize(file.header.spec.num_layers);
  file.segments = Layout(file.header, file.weights);
  const int64_t expected = ExpectedBytes(file.header, file.segments);
  if (file_bytes != expected) {
    return absl::DataLossError(absl::StrCat(
        Where(path), ": file size does not match its header (version ", file.header.version, ", ",
        file.header.spec.shared_classifier ? "shared" : "unshared", " classifier): expected ",
        expected, " bytes, file has ", file_bytes, " (",
        file_bytes < expected ? "truncated" : "extra trailing bytes", ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelSpec> ReadLlama2cSpec(const std::string& path) {
  CheckedFile file;
  if (absl::Status s = OpenAndCheck(path, file); !s.ok()) return s;
  return std::move(file.header.spec);
}

absl::StatusOr<ModelWeights> LoadLlama2cCheckpoint(const std::string& path,
                                                   std::optional<int64_t> host_bytes_available) {
  CheckedFile file;
  if (absl::Status s = OpenAndCheck(path, file); !s.ok()) return s;
  int64_t needed = 0;
  for (const Segment& segment : file.segments) {
    if (segment.dest != nullptr) needed += segment.num_floats * int64_t{sizeof(float)};
  }
  if (host_bytes_available.has_value() && needed > *host_bytes_available) {
    return absl::ResourceExhaustedError(absl::StrCat(Where(path), ": its weights need ", needed,
                                                     " bytes of host memory, more than the ",
                                                     *host_bytes_available, " available"));
  }
  file.stream.seekg(file.header.header_bytes, std::ios::beg);
  for (const Segment& segment : file.segments) {
    const int64_t num_bytes = segment.num_floats * int64_t{sizeof(float)};
    if (segment.dest == nullptr) {
      file.stream.seekg(num_bytes, std::ios::cur);
    } else {
      try {
        segment.dest->resize(segment.num_floats);
      } catch (const std::bad_alloc&) {  // a limit the estimate above did not see
        return absl::ResourceExhaustedError(absl::StrCat(Where(path), ": out of host memory for ",
                                                         num_bytes, " bytes of weights (", needed,
                                                         " in all)"));
      }
      file.stream.read(reinterpret_cast<char*>(segment.dest->data()), num_bytes);
    }
    // The size was checked, so this only trips if the file changes underneath us.
    if (!file.stream) {
      return absl::DataLossError(
          absl::StrCat(Where(path), ": read failed after the size check (file changed?)"));
    }
    // A NaN or infinity would not fail later, only turn every logit into NaN (and the text
    // into <unk>s): a corrupt file, named here.
    if (segment.dest != nullptr) {
      if (absl::Status s = CheckFinite(Where(path), segment.name, *segment.dest); !s.ok()) {
        return s;
      }
    }
  }
  return std::move(file.weights);
}

}  // namespace kvd
