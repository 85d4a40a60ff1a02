#include "spec/spec_overrides.h"

#include <yaml-cpp/yaml.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "spec/spec.h"

namespace dgca {
namespace {

v1::SpecProblem Problem(const std::string& set, const std::string& field,
                        const std::string& message) {
  v1::SpecProblem p;
  p.set_file(absl::StrCat("--set ", set));
  p.set_field(field);
  p.set_message(message);
  return p;
}

bool ValidKeyPart(const std::string& part) {
  if (part.empty() || part.size() > 64) return false;
  for (char c : part) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  }
  return true;
}

}  // namespace

SpecOverrideResult ApplySpecOverrides(const std::string& yaml, const std::string& spec_path,
                                      const std::vector<std::string>& sets) {
  SpecOverrideResult r;
  if (sets.empty()) {
    r.yaml = yaml;
    return r;
  }
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {  // the file parsed before; not expected
    r.problems.push_back(Problem(sets.front(), "(syntax)",
                                 absl::StrCat(spec_path, " cannot be read again: ", e.what())));
    return r;
  }
  if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  for (const std::string& set : sets) {
    const size_t eq = set.find('=');
    const std::string key = set.substr(0, eq);
    std::vector<std::string> path = absl::StrSplit(key, '.');
    bool key_ok = eq != std::string::npos;
    for (const std::string& part : path) key_ok = key_ok && ValidKeyPart(part);
    if (!key_ok) {
      r.problems.push_back(Problem(
          set, key.empty() ? "(key)" : key,
          "expected KEY=VALUE, KEY a dotted path of spec fields (train.steps=200, "
          "resources.ranks=4, comm.env.NCCL_DEBUG=INFO)"));
      continue;
    }
    YAML::Node value;
    try {
      value = YAML::Load(set.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      r.problems.push_back(
          Problem(set, key, absl::StrCat("the value is not YAML: ", e.msg)));
      continue;
    }
    if (value.IsNull() && set.size() == eq + 1) value = YAML::Node("");
    // Into a copy of the spec so far, making the mappings on the way.
    YAML::Node candidate = YAML::Clone(root);
    YAML::Node at = candidate;
    std::string walked;
    bool bad = false;
    for (size_t i = 0; i + 1 < path.size() && !bad; ++i) {
      walked = walked.empty() ? path[i] : absl::StrCat(walked, ".", path[i]);
      YAML::Node next = at[path[i]];
      if (!next.IsDefined() || next.IsNull()) {
        at[path[i]] = YAML::Node(YAML::NodeType::Map);
        next.reset(at[path[i]]);
      } else if (!next.IsMap()) {
        r.problems.push_back(Problem(
            set, key,
            absl::StrCat(walked, " is a single value in ", spec_path, ", not a mapping with ",
                         path[i + 1], " in it")));
        bad = true;
      }
      at.reset(next);  // rebinds; `at = next` would assign into the tree
    }
    if (bad) continue;
    at[path.back()] = value;
    // The spec with this value among the file's (and the overrides before
    // it): the problems of KEY itself are named at the flag, with the file's
    // other values in place (a rule between fields sees the real ones).
    YAML::Emitter emitted;
    emitted << candidate;
    auto parsed = ParseJobSpec(std::string(emitted.c_str(), emitted.size()),
                               absl::StrCat("--set ", set));
    if (!parsed.ok()) {
      r.problems.push_back(Problem(set, key, std::string(parsed.status().message())));
      continue;
    }
    for (v1::SpecProblem p : parsed->problems) {
      if (p.field() != key && !absl::StartsWith(p.field(), key + ".") &&
          !absl::StartsWith(key, p.field() + ".")) {
        continue;  // another field's: the merged spec below names it
      }
      p.set_line(0);  // lines of a document the user never wrote
      p.set_column(0);
      r.problems.push_back(std::move(p));
      bad = true;
    }
    if (!bad) root.reset(candidate);
  }
  if (!r.problems.empty()) return r;
  YAML::Emitter out;
  out << root;
  r.yaml = absl::StrCat("# ", spec_path, " with --set ", absl::StrJoin(sets, " --set "), "\n",
                        std::string(out.c_str(), out.size()), "\n");
  // Rules that tie fields together, now with every value in place.
  const std::string label = absl::StrCat(spec_path, " with --set");
  auto merged = ParseJobSpec(r.yaml, label);
  if (!merged.ok()) {
    r.problems.push_back(Problem(sets.back(), "(merged)", std::string(merged.status().message())));
  } else {
    for (auto& p : merged->problems) {
      p.set_line(0);  // lines of the re-emitted YAML, not of the file
      p.set_column(0);
      r.problems.push_back(std::move(p));
    }
  }
  if (!r.problems.empty()) r.yaml.clear();
  return r;
}

}  // namespace dgca
