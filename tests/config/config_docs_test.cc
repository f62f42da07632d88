// The documentation and the example file are specifications too: these tests fail when a key
// is added, removed or given a new default without updating config/README.md and
// config/inference_config.yaml.

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "config/config_key.h"
#include "config/config_loader.h"
#include "gtest/gtest.h"

namespace kvd {
namespace {

std::string ReadSourceFile(const std::string& relative_path) {
  std::ifstream file(std::string(KVD_SOURCE_DIR) + "/" + relative_path);
  EXPECT_TRUE(file.good()) << relative_path;
  std::ostringstream contents;
  contents << file.rdbuf();
  return contents.str();
}

std::string Trim(const std::string& s) {
  const size_t begin = s.find_first_not_of(" \t");
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(" \t") - begin + 1);
}

// "`x`" -> "x"; "`\"\"`" -> "" (how the README writes an empty default).
std::string Unquote(std::string cell) {
  cell = Trim(cell);
  if (cell.size() >= 2 && cell.front() == '`' && cell.back() == '`') {
    cell = cell.substr(1, cell.size() - 2);
  }
  return cell == "\"\"" ? "" : cell;
}

// A row of the README's key table.
struct ReadmeRow {
  std::string type;
  std::string default_value;
  std::string allowed;
};

// Rows of the table under the README's "## Keys" heading
// ("| `key` | type | `default` | allowed | description |"): key -> row.
std::map<std::string, ReadmeRow> ReadmeKeyTable(const std::string& readme) {
  std::map<std::string, ReadmeRow> rows;
  std::istringstream lines(readme);
  bool in_keys_section = false;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("## ", 0) == 0) in_keys_section = (line == "## Keys");
    if (!in_keys_section || line.rfind("| `", 0) != 0) continue;
    std::vector<std::string> cells;
    std::istringstream row(line.substr(1));
    for (std::string cell; std::getline(row, cell, '|');) cells.push_back(cell);
    EXPECT_GE(cells.size(), 5u) << line;
    if (cells.size() < 5) continue;
    const std::string key = Unquote(cells[0]);
    EXPECT_EQ(rows.count(key), 0u) << "listed twice: " << key;
    rows[key] = {Trim(cells[1]), Unquote(cells[2]), Trim(cells[3])};
  }
  return rows;
}

TEST(ConfigDocsTest, ReadmeListsExactlyTheKnownKeysWithTheirDefaults) {
  std::map<std::string, ReadmeRow> documented = ReadmeKeyTable(ReadSourceFile("config/README.md"));
  const InferenceConfig defaults;
  for (const ConfigKey& key : ConfigKeys()) {
    auto it = documented.find(key.path);
    if (it == documented.end()) {
      ADD_FAILURE() << "config/README.md does not document " << key.path;
      continue;
    }
    EXPECT_EQ(it->second.default_value, key.get(defaults)) << "README default of " << key.path;
    EXPECT_EQ(it->second.type, key.type) << "README type of " << key.path;
    documented.erase(it);
  }
  for (const auto& [key, unused] : documented) {
    ADD_FAILURE() << "config/README.md documents unknown key " << key;
  }
}

// Where the README gives a numeric range "lo .. hi", the key takes both ends and refuses
// just past either (the README's numbers once could drift from the parser's unnoticed).
TEST(ConfigDocsTest, ReadmeRangesAreTheParsersRanges) {
  const std::map<std::string, ReadmeRow> documented =
      ReadmeKeyTable(ReadSourceFile("config/README.md"));
  int checked = 0;
  for (const ConfigKey& key : ConfigKeys()) {
    auto it = documented.find(key.path);
    if (it == documented.end()) continue;  // the test above reports it
    const std::string& allowed = it->second.allowed;
    const size_t dots = allowed.find(" .. ");
    double lo = 0, hi = 0;
    if (dots == std::string::npos || !absl::SimpleAtod(allowed.substr(0, dots), &lo) ||
        !absl::SimpleAtod(allowed.substr(dots + 4), &hi)) {
      continue;  // not a plain numeric range ("power of two, 1 .. 256", "0 .. 2^64-1", ...)
    }
    const bool integer = key.type == "integer";
    const double step = integer ? 1.0 : (hi - lo) / 1000;
    auto accepts = [&](double v) {
      InferenceConfig config;
      return key.set(config, integer ? absl::StrCat(static_cast<int64_t>(v)) : absl::StrCat(v))
          .ok();
    };
    SCOPED_TRACE(key.path + ": README allows " + allowed);
    EXPECT_TRUE(accepts(lo));
    EXPECT_TRUE(accepts(hi));
    EXPECT_FALSE(accepts(lo - step));
    EXPECT_FALSE(accepts(hi + step));
    ++checked;
  }
  EXPECT_GE(checked, 8);
}

TEST(ConfigDocsTest, ExampleFileIsEveryKeyAtItsDefault) {
  absl::StatusOr<InferenceConfig> config =
      LoadConfigFile(std::string(KVD_SOURCE_DIR) + "/config/inference_config.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(*config, InferenceConfig{});
  // Every key is spelled out: without comments and blank lines it is the dump of defaults.
  std::istringstream lines(ReadSourceFile("config/inference_config.yaml"));
  std::string stripped;
  for (std::string line; std::getline(lines, line);) {
    const std::string trimmed = Trim(line);
    if (trimmed.empty() || trimmed[0] == '#') continue;
    stripped += line + "\n";
  }
  EXPECT_EQ(stripped, DumpConfigYaml(InferenceConfig{}));
}

}  // namespace
}  // namespace kvd
