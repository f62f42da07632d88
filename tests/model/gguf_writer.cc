#include "tests/model/gguf_writer.h"

#include <bit>
#include <cstring>
#include <fstream>
#include <utility>

#include "gtest/gtest.h"

namespace kvd::test {

namespace {

template <typename T>
std::string Le(T value) {
  std::string out(sizeof(T), '\0');
  std::memcpy(out.data(), &value, sizeof(T));
  return out;
}

std::string Str(const std::string& s) { return Le<uint64_t>(s.size()) + s; }

}  // namespace

void GgufWriter::AddUint32(const std::string& key, uint32_t value) { AddRaw(key, 4, Le(value)); }
void GgufWriter::AddInt32(const std::string& key, int32_t value) { AddRaw(key, 5, Le(value)); }
void GgufWriter::AddFloat32(const std::string& key, float value) { AddRaw(key, 6, Le(value)); }
void GgufWriter::AddString(const std::string& key, const std::string& value) {
  AddRaw(key, 8, Str(value));
}

void GgufWriter::AddStrings(const std::string& key, const std::vector<std::string>& values) {
  std::string bytes = Le<uint32_t>(8) + Le<uint64_t>(values.size());
  for (const std::string& v : values) bytes += Str(v);
  AddRaw(key, 9, bytes);
}

void GgufWriter::AddFloats(const std::string& key, const std::vector<float>& values) {
  AddRaw(key, 9, Le<uint32_t>(6) + Le<uint64_t>(values.size()) + F32(values));
}

void GgufWriter::AddInt32s(const std::string& key, const std::vector<int32_t>& values) {
  std::string bytes = Le<uint32_t>(5) + Le<uint64_t>(values.size());
  for (int32_t v : values) bytes += Le(v);
  AddRaw(key, 9, bytes);
}

void GgufWriter::AddRaw(const std::string& key, uint32_t type, const std::string& value_bytes) {
  metadata_.emplace_back(key, Le(type) + value_bytes);
}

void GgufWriter::AddTensor(const std::string& name, const std::vector<uint64_t>& dims,
                           uint32_t type, const std::string& data, std::optional<uint64_t> offset) {
  tensors_.push_back({name, dims, type, data, offset});
}

std::string GgufWriter::Bytes(uint32_t version, uint64_t alignment) const {
  std::string out =
      "GGUF" + Le(version) + Le<uint64_t>(tensors_.size()) + Le<uint64_t>(metadata_.size());
  for (const auto& [key, value] : metadata_) out += Str(key) + value;
  std::string data;
  for (const Tensor& t : tensors_) {
    while (data.size() % alignment != 0) data += '\0';
    const uint64_t offset = t.offset.value_or(data.size());
    out += Str(t.name) + Le<uint32_t>(t.dims.size());
    for (uint64_t d : t.dims) out += Le(d);
    out += Le(t.type) + Le(offset);
    data += t.data;
  }
  while (out.size() % alignment != 0) out += '\0';
  return out + data;
}

std::string GgufWriter::WriteTemp(const std::string& name, uint32_t version) const {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << Bytes(version);
  return path;
}

std::string GgufWriter::F32(const std::vector<float>& values) {
  std::string out;
  for (float v : values) out += Le(v);
  return out;
}

std::string GgufWriter::U16(const std::vector<uint16_t>& bits) {
  std::string out;
  for (uint16_t b : bits) out += Le(b);
  return out;
}

GgufWriter TinyLlamaGguf::Writer() const {
  GgufWriter w;
  w.AddString("general.architecture", architecture);
  w.AddUint32("llama.embedding_length", 8);
  w.AddUint32("llama.feed_forward_length", 12);
  w.AddUint32("llama.block_count", 2);
  w.AddUint32("llama.attention.head_count", 2);
  if (write_head_count_kv) w.AddUint32("llama.attention.head_count_kv", 1);
  w.AddUint32("llama.context_length", 64);
  w.AddFloat32("llama.rope.freq_base", rope_theta);
  w.AddFloat32("llama.attention.layer_norm_rms_epsilon", 1e-6f);
  w.AddUint32("llama.rope.dimension_count", 4);
  using Shapes = std::vector<std::pair<std::string, std::vector<uint64_t>>>;
  Shapes tensors = {{"token_embd.weight", {8, 16}}, {"output_norm.weight", {8}}};
  if (with_output) tensors.push_back({"output.weight", {8, 16}});
  for (int l = 0; l < 2; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    for (auto& [name, dims] : Shapes{{"attn_norm", {8}},
                                     {"attn_q", {8, 8}},
                                     {"attn_k", {8, 4}},
                                     {"attn_v", {8, 4}},
                                     {"attn_output", {8, 8}},
                                     {"ffn_norm", {8}},
                                     {"ffn_gate", {8, 12}},
                                     {"ffn_down", {12, 8}},
                                     {"ffn_up", {8, 12}}}) {
      tensors.push_back({b + name + ".weight", dims});
    }
  }
  for (size_t k = 0; k < tensors.size(); ++k) {
    auto& [name, dims] = tensors[k];
    if (name == drop) continue;
    if (name == reshape) dims = {3};
    uint64_t n = 1;
    for (uint64_t d : dims) n *= d;
    std::vector<float> values(n);
    for (uint64_t i = 0; i < n; ++i) values[i] = static_cast<float>(k) + i / 1024.0f;
    if (name == int8_tensor) {
      w.AddTensor(name, dims, 24, std::string(n, '\0'));
    } else if (type == 0) {
      w.AddTensor(name, dims, 0, GgufWriter::F32(values));
    } else {  // BF16: the values' top halves
      std::vector<uint16_t> bits;
      for (float v : values) bits.push_back(std::bit_cast<uint32_t>(v) >> 16);
      w.AddTensor(name, dims, type, GgufWriter::U16(bits));
    }
  }
  return w;
}

}  // namespace kvd::test
