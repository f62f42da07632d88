#include "config/config_loader.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "config/config_key.h"
#include "yaml-cpp/anchor.h"
#include "yaml-cpp/eventhandler.h"
#include "yaml-cpp/yaml.h"

namespace kvd {
namespace {

absl::string_view AsAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Immediate children (key or section names) of the section `section` ("" = top level), in
// table order.
std::vector<std::string> ChildNames(std::string_view section) {
  std::vector<std::string> names;
  for (const ConfigKey& key : ConfigKeys()) {
    std::string_view rest = key.path;
    if (!section.empty()) {
      if (!(rest.size() > section.size() && rest.starts_with(section) &&
            rest[section.size()] == '.')) {
        continue;
      }
      rest.remove_prefix(section.size() + 1);
    }
    std::string name(rest.substr(0, rest.find('.')));
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  return names;
}

absl::Status UnknownKey(std::string_view path, std::string_view where, ConfigPathUse use) {
  std::string message = absl::StrCat(AsAbsl(where), "unknown key '", AsAbsl(path), "'");
  const std::string suggestion = SuggestConfigKey(path, use);
  if (!suggestion.empty()) absl::StrAppend(&message, "; did you mean '", suggestion, "'?");
  // The nearest enclosing section that exists ('servr.drain_timeout': the top level).
  const std::string_view parent = NearestConfigSection(path);
  absl::StrAppend(
      &message, "; allowed ",
      parent.empty() ? std::string("sections") : absl::StrCat("keys in '", AsAbsl(parent), "'"),
      ": ", absl::StrJoin(ChildNames(parent), ", "));
  return absl::InvalidArgumentError(message);
}

absl::Status SectionIsNotAKey(std::string_view path, std::string_view where) {
  return absl::InvalidArgumentError(absl::StrCat(
      AsAbsl(where), "'", AsAbsl(path),
      "' is a section, not a key; allowed keys in it: ", absl::StrJoin(ChildNames(path), ", ")));
}

std::string NodeKind(const YAML::Node& node) {
  if (node.IsMap()) return "a map";
  if (node.IsSequence()) return "a list";
  if (node.IsNull()) return "nothing (blank, ~ or null)";
  return "a scalar";
}

std::string Where(const YAML::Node& node) {
  return absl::StrCat("line ", node.Mark().line + 1, ": ");
}

// Prefixes `status`'s message with `prefix`, keeping its code.
absl::Status Prefixed(const absl::Status& status, std::string_view prefix) {
  return absl::Status(status.code(), absl::StrCat(AsAbsl(prefix), status.message()));
}

// Applies the map `node` found at section `section` ("" = the document) to `config`.
// `seen` collects full key paths to refuse duplicates.
absl::Status ApplySection(const YAML::Node& node, const std::string& section,
                          InferenceConfig& config, std::set<std::string>& seen) {
  if (node.IsNull()) return absl::OkStatus();  // "section:" with nothing under it
  if (!node.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(node),
        section.empty() ? std::string("the document") : absl::StrCat("'", section, "'"),
        " must be a map, got ", NodeKind(node), "; allowed ", section.empty() ? "sections" : "keys",
        ": ", absl::StrJoin(ChildNames(section), ", ")));
  }
  for (const auto& entry : node) {
    const YAML::Node& name = entry.first;
    const YAML::Node& value = entry.second;
    const std::string where = Where(name);
    if (!name.IsScalar()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "a key must be a plain name, got ", NodeKind(name), "; allowed ",
                       section.empty() ? "sections" : absl::StrCat("keys in '", section, "'"), ": ",
                       absl::StrJoin(ChildNames(section), ", ")));
    }
    const std::string path =
        section.empty() ? name.Scalar() : absl::StrCat(section, ".", name.Scalar());
    if (!seen.insert(path).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, "duplicate key '", path, "'"));
    }
    if (const ConfigKey* key = FindConfigKey(path); key != nullptr) {
      // "key:" with no value (or ~, or null) is refused rather than read as empty text: a
      // template's unset variable would otherwise turn server.metrics_address off, or
      // model.path to the default model, without a word. "" is the empty string.
      if (value.IsNull()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, path, ": no value (blank, ~ or null); allowed: ", key->allowed,
                         key->type == "string" ? " (an empty string is written \"\")" : ""));
      }
      if (!value.IsScalar()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, path, ": invalid value (", NodeKind(value), "); allowed: ", key->allowed));
      }
      if (absl::Status status = key->set(config, value.Scalar()); !status.ok()) {
        return Prefixed(status, where);
      }
    } else if (IsConfigSection(path)) {
      if (absl::Status status = ApplySection(value, path, config, seen); !status.ok()) {
        return status;
      }
    } else {
      return UnknownKey(path, where, value.IsMap() ? ConfigPathUse::kSection : ConfigPathUse::kKey);
    }
  }
  return absl::OkStatus();
}

// Where each document of a YAML stream starts, from yaml-cpp's event parser; the events
// inside a document are not needed.
struct DocumentStarts : public YAML::EventHandler {
  void OnDocumentStart(const YAML::Mark& mark) override { marks.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}

  std::vector<YAML::Mark> marks;
};

// Where each document of `yaml` starts. Instead of YAML::LoadAll, which in yaml-cpp 0.7
// (Debian 12's) never returns on a document that starts with a ',', and allocates all the
// while: the parser reports an empty document and leaves the ',' for the next one
// (jbeder/yaml-cpp#1040; fixed by #1319 in September 2024, after the 0.8.0 release). Any
// other document consumes input, so one that starts where the one before it did is that
// loop: a syntax error at that place.
std::vector<YAML::Mark> DocumentMarks(const std::string& yaml) {
  std::istringstream stream(yaml);
  YAML::Parser parser(stream);
  DocumentStarts starts;
  while (parser.HandleNextDocument(starts)) {
    const std::vector<YAML::Mark>& marks = starts.marks;
    if (marks.size() >= 2 && marks.back().pos == marks[marks.size() - 2].pos) {
      throw YAML::ParserException(marks.back(), "no YAML node starts here");
    }
  }
  return starts.marks;
}

// ParseConfigYaml without the checks between keys.
absl::StatusOr<InferenceConfig> ParseUnvalidated(std::string_view yaml) {
  InferenceConfig config;
  try {
    const std::string text(yaml);
    if (const std::vector<YAML::Mark> documents = DocumentMarks(text); documents.size() > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", documents[1].line + 1,
                       ": a config file holds one YAML document, found ", documents.size()));
    }
    std::set<std::string> seen;
    if (absl::Status status = ApplySection(YAML::Load(text), "", config, seen); !status.ok()) {
      return status;
    }
  } catch (const YAML::Exception& e) {
    // Syntax errors (and anything else yaml-cpp throws) stop here; marks are 0-based.
    return absl::InvalidArgumentError(absl::StrCat("invalid YAML at line ", e.mark.line + 1,
                                                   ", column ", e.mark.column + 1, ": ", e.msg));
  }
  return config;
}

// LoadConfigFile without the checks between keys.
absl::StatusOr<InferenceConfig> LoadUnvalidated(const std::string& path) {
  // An ifstream opens a directory and reads it as empty, which would be the defaults: an easy
  // mistake to miss (`--config /etc/kvd`, the folder a Kubernetes ConfigMap is mounted on).
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  if (std::filesystem::is_directory(status)) {  // pipes (--config <(...)) still read fine
    return absl::InvalidArgumentError(
        absl::StrCat("config file '", path, "' is a directory; allowed: the path of a YAML file"));
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return absl::NotFoundError(
        absl::StrCat("cannot read config file '", path, "': ", std::strerror(errno)));
  }
  std::ostringstream contents;
  contents << file.rdbuf();
  if (file.bad()) {
    return absl::InvalidArgumentError(absl::StrCat("error reading config file '", path, "'"));
  }
  absl::StatusOr<InferenceConfig> config = ParseUnvalidated(contents.str());
  if (!config.ok()) return Prefixed(config.status(), absl::StrCat(path, ": "));
  return config;
}

// ApplyOverrides without the checks between keys.
absl::Status ApplyAll(InferenceConfig& config, absl::Span<const std::string> assignments) {
  for (const std::string& assignment : assignments) {
    const size_t equals = assignment.find('=');
    if (equals == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("override '", assignment,
                                                     "': expected dotted.key=value, e.g. "
                                                     "kv_cache_config.block_size=32"));
    }
    const std::string_view text = assignment;
    if (absl::Status status =
            ApplyOverride(config, text.substr(0, equals), text.substr(equals + 1));
        !status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<InferenceConfig> ParseConfigYaml(std::string_view yaml) {
  absl::StatusOr<InferenceConfig> config = ParseUnvalidated(yaml);
  if (!config.ok()) return config;
  if (absl::Status status = config->Validate(); !status.ok()) return status;
  return config;
}

absl::StatusOr<InferenceConfig> LoadConfigFile(const std::string& path) {
  absl::StatusOr<InferenceConfig> config = LoadUnvalidated(path);
  if (!config.ok()) return config;
  if (absl::Status status = config->Validate(); !status.ok()) {
    return Prefixed(status, absl::StrCat(path, ": "));
  }
  return config;
}

absl::StatusOr<InferenceConfig> LoadConfig(const std::optional<std::string>& path,
                                           absl::Span<const std::string> overrides) {
  InferenceConfig config;
  if (path.has_value()) {
    absl::StatusOr<InferenceConfig> loaded = LoadUnvalidated(*path);
    if (!loaded.ok()) return loaded;
    config = *std::move(loaded);
  }
  if (absl::Status status = ApplyAll(config, overrides); !status.ok()) return status;
  if (absl::Status status = config.Validate(); !status.ok()) return status;
  return config;
}

absl::Status ApplyOverride(InferenceConfig& config, std::string_view dotted_key,
                           std::string_view value) {
  if (const ConfigKey* key = FindConfigKey(dotted_key); key != nullptr) {
    return key->set(config, value);
  }
  if (IsConfigSection(dotted_key)) return SectionIsNotAKey(dotted_key, "");
  return UnknownKey(dotted_key, "", ConfigPathUse::kKey);
}

absl::Status ApplyOverrides(InferenceConfig& config, absl::Span<const std::string> assignments) {
  if (absl::Status status = ApplyAll(config, assignments); !status.ok()) return status;
  return config.Validate();
}

std::string DumpConfigYaml(const InferenceConfig& config) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::vector<std::string> open;  // the sections currently open, outermost first
  for (const ConfigKey& key : ConfigKeys()) {
    std::vector<std::string> parts;
    std::string_view rest = key.path;
    for (size_t dot = rest.find('.'); dot != std::string_view::npos; dot = rest.find('.')) {
      parts.emplace_back(rest.substr(0, dot));
      rest.remove_prefix(dot + 1);
    }
    size_t common = 0;
    while (common < open.size() && common < parts.size() && open[common] == parts[common]) {
      ++common;
    }
    for (; open.size() > common; open.pop_back()) out << YAML::EndMap;
    for (; open.size() < parts.size(); open.push_back(parts[open.size()])) {
      out << YAML::Key << parts[open.size()] << YAML::Value << YAML::BeginMap;
    }
    out << YAML::Key << std::string(rest) << YAML::Value << key.get(config);
  }
  for (; !open.empty(); open.pop_back()) out << YAML::EndMap;
  out << YAML::EndMap;
  return absl::StrCat(out.c_str(), "\n");
}

}  // namespace kvd
