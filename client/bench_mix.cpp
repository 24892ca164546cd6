#include "bench_mix.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

namespace qpool::cli {
namespace {

// A mix is a handful of templates; anything this large is the wrong file.
constexpr size_t kMaxMixBytes = 4 << 20;

// Field names an entry may use; the second of each pair is an accepted alias.
const std::vector<std::pair<std::string, std::string>>& Fields() {
  static const std::vector<std::pair<std::string, std::string>> fields = {
      {"name", ""},
      {"weight", ""},
      {"pipeline", ""},
      {"prompt", ""},
      {"prompts", ""},
      {"negative_prompt", "negative"},
      {"steps", ""},
      {"width", ""},
      {"height", ""},
      {"guidance", "guidance_scale"},
      {"num_images", "batch"},
      {"seed", ""},
      {"scheduler", ""},
      {"deadline", ""},
  };
  return fields;
}

// Thrown inside the parser and turned into MixResult::error at its boundary.
struct MixError {
  std::string message;
};

class EntryParser {
 public:
  EntryParser(const std::string& source, const YAML::Node& entry, size_t number)
      : source_(source), entry_(entry), number_(number) {}

  RequestTemplate Parse() {
    if (!entry_.IsMap()) {
      Fail(entry_, "entry " + std::to_string(number_) +
                       " is not a mapping; each entry is 'pipeline: NAME' plus optional fields");
    }
    CheckKeys();
    RequestTemplate t;
    t.pipeline = String("pipeline", /*required=*/true).value();
    t.name = String("name", false).value_or("");
    if (const YAML::Node n = Field("weight")) {
      t.weight = Number(n, "weight");
      if (!(t.weight > 0)) Fail(n, "'weight' must be > 0, got " + n.Scalar());
    }
    const YAML::Node prompt = Field("prompt");
    const YAML::Node prompts = Field("prompts");
    if (prompt && prompts) Fail(prompts, "give 'prompt' or 'prompts', not both");
    if (prompt) t.prompts.push_back(Text(prompt, "prompt"));
    if (prompts) {
      if (!prompts.IsSequence() || prompts.size() == 0) {
        Fail(prompts, "'prompts' must be a non-empty list of strings");
      }
      for (const YAML::Node& p : prompts) t.prompts.push_back(Text(p, "prompts"));
    }
    if (t.prompts.empty()) t.prompts = DefaultPrompts();
    t.negative_prompt = String("negative_prompt", false);
    t.steps = Uint32("steps");
    t.width = Uint32("width");
    t.height = Uint32("height");
    t.num_images = Uint32("num_images");
    if (const YAML::Node n = Field("guidance")) t.guidance = Number(n, "guidance");
    if (const YAML::Node n = Field("seed")) t.seed = Uint(n, "seed");
    t.scheduler = String("scheduler", false).value_or("");
    if (const YAML::Node n = Field("deadline")) {
      t.deadline_seconds = Number(n, "deadline");
      if (!(*t.deadline_seconds > 0)) {
        Fail(n, "'deadline' must be a number of seconds > 0, got " + n.Scalar());
      }
    }
    return t;
  }

  [[noreturn]] void Fail(const YAML::Node& node, const std::string& what) const {
    std::string where = source_;
    const YAML::Mark mark = node.Mark();
    if (!mark.is_null()) {
      where += ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
    }
    throw MixError{where + ": " + what};
  }

 private:
  void CheckKeys() const {
    std::set<std::string> seen;
    for (const auto& item : entry_) {
      const std::string key = item.first.IsScalar() ? item.first.Scalar() : "";
      const auto known = std::find_if(Fields().begin(), Fields().end(), [&key](const auto& f) {
        return key == f.first || (!f.second.empty() && key == f.second);
      });
      if (known == Fields().end()) {
        std::string names;
        for (const auto& f : Fields()) names += (names.empty() ? "" : ", ") + f.first;
        Fail(item.first, "unknown field '" + key + "' in entry " + std::to_string(number_) +
                             "; known fields: " + names);
      }
      if (!seen.insert(known->first).second) {
        Fail(item.first,
             "field '" + known->first + "' is given twice in entry " + std::to_string(number_));
      }
    }
  }

  // The entry's value of field `name` (or its alias); an undefined node when absent.
  YAML::Node Field(const std::string& name) const {
    for (const auto& f : Fields()) {
      if (f.first != name) continue;
      if (entry_[f.first]) return entry_[f.first];
      if (!f.second.empty() && entry_[f.second]) return entry_[f.second];
    }
    return YAML::Node(YAML::NodeType::Undefined);
  }

  std::string Text(const YAML::Node& n, const std::string& field) const {
    if (!n.IsScalar()) Fail(n, "'" + field + "' must be a string");
    return n.Scalar();
  }

  std::optional<std::string> String(const std::string& field, bool required) const {
    const YAML::Node n = Field(field);
    if (!n) {
      if (required) {
        Fail(entry_, "entry " + std::to_string(number_) + " has no '" + field + "'");
      }
      return std::nullopt;
    }
    const std::string text = Text(n, field);
    if (text.empty()) Fail(n, "'" + field + "' must not be empty");
    return text;
  }

  uint64_t Uint(const YAML::Node& n, const std::string& field) const {
    const std::string text = n.IsScalar() ? n.Scalar() : "";
    errno = 0;
    const unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
    if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos || errno != 0) {
      Fail(n, "'" + field + "' wants a non-negative integer, got '" + text + "'");
    }
    return v;
  }

  std::optional<uint32_t> Uint32(const std::string& field) const {
    const YAML::Node n = Field(field);
    if (!n) return std::nullopt;
    const uint64_t v = Uint(n, field);
    if (v > std::numeric_limits<uint32_t>::max()) Fail(n, "'" + field + "' is too large");
    return static_cast<uint32_t>(v);
  }

  double Number(const YAML::Node& n, const std::string& field) const {
    const std::string text = n.IsScalar() ? n.Scalar() : "";
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || errno != 0 || !std::isfinite(v)) {
      Fail(n, "'" + field + "' wants a number, got '" + text + "'");
    }
    return v;
  }

  const std::string& source_;
  const YAML::Node& entry_;
  size_t number_;  // 1-based, for messages
};

}  // namespace

const std::vector<std::string>& DefaultPrompts() {
  static const std::vector<std::string> prompts = {
      "a red fox in the snow", "a lighthouse at dusk, oil painting",
      "a bowl of ramen, studio photo", "a city street in the rain"};
  return prompts;
}

MixResult ParseMix(const std::string& text, const std::string& source) {
  MixResult result;
  if (text.size() > kMaxMixBytes) {
    result.error = source + ": is " + std::to_string(text.size()) +
                   " bytes; a mix file may have at most " + std::to_string(kMaxMixBytes);
    return result;
  }
  YAML::Node root;
  try {
    // YAML::Load reads the first document only (YAML::LoadAll can loop forever on some texts
    // with yaml-cpp 0.7).
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    result.error = source +
                   (e.mark.is_null() ? std::string()
                                     : ":" + std::to_string(e.mark.line + 1) + ":" +
                                           std::to_string(e.mark.column + 1)) +
                   ": not valid YAML or JSON: " + e.msg;
    return result;
  }
  try {
    if (!root.IsSequence() || root.size() == 0) {
      result.error = source +
                     ": a mix is a non-empty list of request templates, e.g.\n"
                     "  - pipeline: NAME\n    weight: 1\n    steps: 20";
      return result;
    }
    std::map<std::string, size_t> names;  // name -> entry number
    size_t number = 0;
    for (const YAML::Node& entry : root) {
      ++number;
      EntryParser parser(source, entry, number);
      RequestTemplate t = parser.Parse();
      if (t.name.empty()) {
        // Unnamed entries are named after their pipeline, numbered when it repeats.
        t.name = t.pipeline;
        for (int n = 2; names.count(t.name) != 0; ++n)
          t.name = t.pipeline + "#" + std::to_string(n);
      } else if (names.count(t.name) != 0) {
        parser.Fail(entry["name"], "name '" + t.name + "' is already used by entry " +
                                       std::to_string(names[t.name]) +
                                       "; give each entry its own name");
      }
      names[t.name] = number;
      result.templates.push_back(std::move(t));
    }
  } catch (const MixError& e) {
    result.templates.clear();
    result.error = e.message;
  } catch (const YAML::Exception& e) {  // yaml-cpp surprises: still name the file
    result.templates.clear();
    result.error = source + ": " + e.what();
  }
  return result;
}

MixResult LoadMix(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {{}, "cannot read mix file '" + path + "'"};
  std::ostringstream text;
  text << in.rdbuf();
  return ParseMix(text.str(), path);
}

MixPicker::MixPicker(const std::vector<RequestTemplate>& templates, uint64_t seed) : rng_(seed) {
  double sum = 0;
  for (const RequestTemplate& t : templates) {
    sum += t.weight;
    cumulative_.push_back(sum);
  }
}

size_t MixPicker::Next() {
  if (cumulative_.size() <= 1) return 0;
  // 53 random bits as a double in [0, 1): the same on every standard library, unlike
  // std::uniform_real_distribution.
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
  const double target = u * cumulative_.back();
  const auto it = std::upper_bound(cumulative_.begin(), cumulative_.end(), target);
  return std::min(static_cast<size_t>(it - cumulative_.begin()), cumulative_.size() - 1);
}

}  // namespace qpool::cli
