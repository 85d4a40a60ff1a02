#include "spec/slurm_values.h"

#include <algorithm>
#include <cctype>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "spec/yaml_fields.h"

namespace dgca {

// A Slurm partition, account or qos name: safe in an #SBATCH line.
bool SlurmName(const std::string& s) {
  return !s.empty() && s.size() <= 64 && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

// Slurm's time formats: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
bool SlurmTime(const std::string& t) {
  auto number = [](const std::string& x) {
    return !x.empty() && x.size() <= 6 &&
           std::all_of(x.begin(), x.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  std::string rest = t;
  const size_t dash = t.find('-');
  if (dash != std::string::npos) {
    if (!number(t.substr(0, dash))) return false;
    rest = t.substr(dash + 1);
    const std::vector<std::string> parts = absl::StrSplit(rest, ':');
    return parts.size() <= 3 &&
           std::all_of(parts.begin(), parts.end(), [&](const std::string& x) { return number(x); });
  }
  const std::vector<std::string> parts = absl::StrSplit(rest, ':');
  return parts.size() <= 3 &&
         std::all_of(parts.begin(), parts.end(), [&](const std::string& x) { return number(x); });
}

// Why `arg` cannot be an extra sbatch option ("" when it can): one
// "--name" or "--name=value", not one the coordinator sets itself or one
// with its own field.
std::string SbatchArgProblem(const std::string& arg) {
  static const char* kOwn[] = {"job-name", "nodes", "ntasks", "ntasks-per-node", "output",
                               "error", "parsable", "signal", "requeue", "no-requeue",
                               "chdir", "wrap", "array", "open-mode", "export"};
  static const char* kFields[] = {"partition", "account", "qos", "time", "gpus-per-node"};
  if (arg.size() < 3 || arg.rfind("--", 0) != 0) {
    return absl::StrCat("expected a long option such as '--exclusive' or '--constraint=a100', got ",
                        Quote(arg));
  }
  const size_t eq = arg.find('=');
  const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
  const bool name_ok = !name.empty() && std::islower(static_cast<unsigned char>(name[0])) &&
                       std::all_of(name.begin(), name.end(), [](char c) {
                         return std::islower(static_cast<unsigned char>(c)) ||
                                std::isdigit(static_cast<unsigned char>(c)) || c == '-';
                       });
  if (!name_ok) return absl::StrCat("not an sbatch option name: ", Quote(arg));
  if (arg.size() > 256 || arg.find('\0') != std::string::npos ||
      arg.find_first_of("\n\r\t'\"`$\\;&|<>") != std::string::npos) {
    return absl::StrCat("an sbatch option is one line without quotes, $, `, \\, ;, &, |, < or > "
                        "(at most 256 bytes), got ", Quote(arg));
  }
  for (const char* own : kOwn) {
    if (name == own) {
      return absl::StrCat("--", name, " is set by the coordinator (docs/slurm.md); it cannot be "
                          "given here");
    }
  }
  for (const char* field : kFields) {
    if (name == field) {
      std::string f = field;
      std::replace(f.begin(), f.end(), '-', '_');
      return absl::StrCat("use resources.slurm.", f, " instead of --", name);
    }
  }
  return "";
}

}  // namespace dgca
