#include "spec/spec_files.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "model/core/data.h"
#include "model/core/files.h"
#include "spec/spec.h"

namespace dgca {
namespace {

// The value of `key` in mapping `n`, or an undefined node. Walks the
// mapping instead of n[key]: yaml-cpp's subscript on a scalar or a list
// throws or converts the key, and the caller only wants the mark.
YAML::Node Child(const YAML::Node& n, const char* key) {
  if (!n.IsDefined() || !n.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
  for (auto it = n.begin(); it != n.end(); ++it) {
    if (it->first.IsScalar() && it->first.Scalar() == key) return it->second;
  }
  return YAML::Node(YAML::NodeType::Undefined);
}

// What the rank needs each kind of file to be, in the words of its loader.
struct Kind {
  const char* name;      // InputFile.kind
  const char* what;      // "data file"
  const char* expected;  // what would be valid
};
constexpr Kind kKinds[] = {
    // The data files' wording is CheckDataFile's own (model/core/data.h).
    {"data", "data file", ""},
    {"vocab", "vocabulary file", "a readable regular file: a BERT vocab.txt, one token per line"},
    {"weights", "weights file",
     "a readable regular file: Hugging Face BERT weights (.safetensors)"},
    {"confusion", "confusion-set file",
     "a readable regular file: a JSON confusion set {\"字\": [\"字1\", ...]}"},
};

const Kind* KindOf(const std::string& name) {
  for (const Kind& k : kKinds) {
    if (name == k.name) return &k;
  }
  return nullptr;
}

std::string WorkingDirectory() {
  char buf[PATH_MAX];
  return getcwd(buf, sizeof buf) != nullptr ? std::string(buf) : std::string("(unknown)");
}

// How `f.path` came from what the spec wrote, for the message: nothing for
// an absolute path.
std::string HowResolved(const v1::InputFile& f) {
  if (f.written().empty() || f.written()[0] == '/') return "";
  if (!f.base_dir().empty()) {
    return absl::StrCat("; '", f.written(), "' is relative, so it is taken from the spec file's "
                        "directory ", f.base_dir(), ", as the ranks take it");
  }
  return absl::StrCat("; '", f.written(), "' is relative and the spec came without its "
                      "directory, so it is taken from the working directory (here ",
                      WorkingDirectory(), "), as the ranks take it from their agent's");
}

}  // namespace

std::string ResolveSpecPath(const std::string& base_dir, const std::string& path) {
  if (path.empty() || path[0] == '/' || base_dir.empty()) return path;
  if (base_dir.back() == '/') return base_dir + path;
  return base_dir + "/" + path;
}

std::vector<v1::InputFile> SpecInputFiles(const std::string& yaml_text, const v1::JobSpec& spec) {
  std::vector<v1::InputFile> out;
  if (absl::AsciiStrToLower(spec.kind()) == "comm_probe") return out;  // reads no files
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const std::exception&) {
    // The spec parsed before; without its tree the files go unlocated.
    root = YAML::Node(YAML::NodeType::Undefined);
  }
  const YAML::Node model = Child(root, "model");
  const YAML::Node data = Child(root, "data");
  const YAML::Node candidate = Child(Child(model, "heads"), "candidate");
  auto add = [&](const std::string& field, const std::string& written, const YAML::Node& value,
                 const char* kind) {
    if (written.empty()) return;  // the field's built-in default: no file
    v1::InputFile f;
    f.set_field(field);
    f.set_written(written);
    f.set_path(ResolveSpecPath(spec.base_dir(), written));
    f.set_base_dir(spec.base_dir());
    f.set_spec_file(spec.source_path());
    f.set_kind(kind);
    if (value.IsDefined() && !value.Mark().is_null()) {
      f.set_line(value.Mark().line + 1);
      f.set_column(value.Mark().column + 1);
    }
    out.push_back(std::move(f));
  };
  add("model.vocab", spec.model().vocab(), Child(model, "vocab"), "vocab");
  if (spec.model().heads_spec().candidate().enabled()) {
    add("model.heads.candidate.confusion", spec.model().heads_spec().candidate().confusion(),
        Child(candidate, "confusion"), "confusion");
  }
  add("data.train", spec.data().train(), Child(data, "train"), "data");
  add("data.eval", spec.data().eval(), Child(data, "eval"), "data");
  add("model.init_from", spec.model().init_from(), Child(model, "init_from"), "weights");
  // In the spec's order, as its parse problems are (those without a place
  // last).
  std::stable_sort(out.begin(), out.end(), [](const v1::InputFile& a, const v1::InputFile& b) {
    const int al = a.line() == 0 ? INT32_MAX : a.line(), bl = b.line() == 0 ? INT32_MAX : b.line();
    return al != bl ? al < bl : a.column() < b.column();
  });
  return out;
}

std::vector<v1::SpecProblem> CheckInputFiles(const std::vector<v1::InputFile>& inputs,
                                             const std::string& where) {
  std::vector<v1::SpecProblem> problems;
  for (const v1::InputFile& f : inputs) {
    const Kind* kind = KindOf(f.kind());
    Status st;
    if (kind == nullptr) {
      // A coordinator newer than this agent: its kinds are still files.
      st = CheckInputFile(f.path(), "file", "a readable regular file");
    } else if (std::string(kind->name) == "data") {
      st = CheckDataFile(f.path());
    } else {
      st = CheckInputFile(f.path(), kind->what, kind->expected);
    }
    if (st.ok()) continue;
    v1::SpecProblem p;
    p.set_file(f.spec_file());
    p.set_line(f.line());
    p.set_column(f.column());
    p.set_field(f.field());
    p.set_message(absl::StrCat(st.message(), "; checked ", where, HowResolved(f)));
    problems.push_back(std::move(p));
  }
  return problems;
}

std::string InputProblemsMessage(const std::vector<v1::SpecProblem>& problems,
                                 const std::string& where) {
  std::string out = absl::StrCat(problems.size(), " input file", problems.size() == 1 ? "" : "s",
                                 " of the job cannot be read ", where, ":");
  for (const auto& p : problems) {
    std::string line = FormatProblem(p);
    if (!line.empty() && line.back() == '\n') line.pop_back();
    absl::StrAppend(&out, "\n", line);
  }
  return out;
}

}  // namespace dgca
