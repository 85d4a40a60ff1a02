#include "model/core/files.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

namespace dgca {

Status MakeDirectories(const std::string& path, int mode) {
  if (path.empty()) return InvalidArgumentError("cannot create a directory with an empty path");
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i != path.size() && path[i] != '/') continue;
    const std::string dir = path.substr(0, i);
    if (mkdir(dir.c_str(), static_cast<mode_t>(mode)) != 0 && errno != EEXIST) {
      return FailedPreconditionError("cannot create directory " + dir + ": " +
                                     std::strerror(errno));
    }
  }
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return FailedPreconditionError(path + " exists and is not a directory");
  }
  return OkStatus();
}

}  // namespace dgca
