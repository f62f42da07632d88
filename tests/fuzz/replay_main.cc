// The main() of a fuzz target built without libFuzzer (every build but `make fuzz`'s): runs
// LLVMFuzzerTestOneInput once on each file named, or on each file of each folder named, the
// way libFuzzer replays a corpus. ctest runs it over tests/fuzz/corpus/<target>/, the seeds
// and every input a fuzzer once failed on, so that CI checks them on each change without
// clang. A broken invariant aborts (fuzz_check.h); finding no input at all is an error too,
// since a replay of nothing cannot fail.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

// The files to replay: `path` itself, or the regular files in it, in name order.
std::vector<std::filesystem::path> InputsAt(const std::filesystem::path& path) {
  if (!std::filesystem::is_directory(path)) return {path};
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(path)) {
    if (entry.is_regular_file()) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE_OR_FOLDER...\n", argv[0]);
    return 2;
  }
  int num_inputs = 0;
  for (int i = 1; i < argc; ++i) {
    for (const std::filesystem::path& file : InputsAt(argv[i])) {
      std::ifstream in(file, std::ios::binary);
      if (!in) {
        std::fprintf(stderr, "%s: cannot read %s\n", argv[0], file.c_str());
        return 2;
      }
      const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
      std::fprintf(stderr, "replaying %s (%zu bytes)\n", file.c_str(), bytes.size());
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++num_inputs;
    }
  }
  if (num_inputs == 0) {
    std::fprintf(stderr, "%s: no inputs found\n", argv[0]);
    return 1;
  }
  std::fprintf(stderr, "%d inputs replayed, every invariant held\n", num_inputs);
  return 0;
}
