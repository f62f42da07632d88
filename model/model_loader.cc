#include "model/model_loader.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "model/gguf_loader.h"
#include "model/hf_loader.h"
#include "model/llama2c_loader.h"
#include "model/sentencepiece_model.h"
#include "model/synthetic_model.h"

namespace kvd {

namespace {

constexpr std::string_view kSyntheticPrefix = "synthetic:";

enum class Source { kSynthetic, kGguf, kHf, kLlama2c };

// Whether `path` ends in `extension` (lower case), in any case.
bool HasExtension(std::string_view path, std::string_view extension) {
  if (path.size() < extension.size()) return false;
  std::string tail(path.substr(path.size() - extension.size()));
  for (char& c : tail) c = absl::ascii_tolower(static_cast<unsigned char>(c));
  return tail == extension;
}

absl::StatusOr<Source> Classify(std::string_view model) {
  if (model.empty()) return absl::InvalidArgumentError("model reference is empty");
  if (model.starts_with(kSyntheticPrefix)) return Source::kSynthetic;
  if (HasExtension(model, ".gguf")) return Source::kGguf;
  std::error_code ec;
  const std::filesystem::path path(model);
  if (std::filesystem::is_directory(path, ec)) {
    // A Hugging Face checkpoint is a directory with config.json; any other directory is a
    // wrong path.
    if (std::filesystem::exists(path / "config.json", ec)) return Source::kHf;
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(model),
                     " is a directory without config.json, not a model: give a Hugging Face "
                     "model directory, a GGUF file, a llama2.c .bin checkpoint or "
                     "synthetic:<preset>"));
  }
  return Source::kLlama2c;
}

}  // namespace

absl::StatusOr<ModelWeights> LoadModel(std::string_view model, uint64_t seed) {
  absl::StatusOr<Source> source = Classify(model);
  if (!source.ok()) return source.status();
  if (*source == Source::kSynthetic) {
    absl::StatusOr<ModelSpec> spec = SyntheticSpec(model.substr(kSyntheticPrefix.size()));
    if (!spec.ok()) return spec.status();
    return MakeSyntheticWeights(*spec, seed);
  }
  if (*source == Source::kGguf) return LoadGgufModel(std::string(model), AvailableHostBytes());
  if (*source == Source::kHf) return LoadHfModel(std::string(model), AvailableHostBytes());
  return LoadLlama2cCheckpoint(std::string(model), AvailableHostBytes());
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadModelTokenizer(std::string_view model,
                                                              int32_t vocab_size) {
  absl::StatusOr<Source> source = Classify(model);
  if (!source.ok()) return source.status();
  if (*source == Source::kGguf) return LoadGgufTokenizer(std::string(model), vocab_size);
  if (*source == Source::kHf) return LoadHfTokenizer(std::string(model), vocab_size);
  return Tokenizer::FindBesideModel(std::string(model), vocab_size);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizerFile(const std::string& path,
                                                             int32_t vocab_size) {
  if (HasExtension(path, ".gguf")) return LoadGgufTokenizer(path, vocab_size);
  if (HasExtension(path, ".model")) return LoadSentencePieceTokenizer(path, vocab_size);
  return Tokenizer::LoadLlama2c(path, vocab_size);
}

std::optional<int64_t> AvailableHostBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    long long kib = 0;  // "MemAvailable:   12345 kB"
    if (std::sscanf(line.c_str(), "MemAvailable: %lld kB", &kib) == 1 && kib >= 0) {
      return int64_t{kib} * 1024;
    }
  }
  return std::nullopt;
}

absl::StatusOr<ModelSpec> LoadModelSpec(std::string_view model) {
  absl::StatusOr<Source> source = Classify(model);
  if (!source.ok()) return source.status();
  if (*source == Source::kSynthetic) {
    return SyntheticSpec(model.substr(kSyntheticPrefix.size()));
  }
  if (*source == Source::kGguf) return ReadGgufSpec(std::string(model));
  if (*source == Source::kHf) return ReadHfSpec(std::string(model));
  return ReadLlama2cSpec(std::string(model));
}

}  // namespace kvd
