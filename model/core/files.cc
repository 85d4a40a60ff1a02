#include "model/core/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

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

namespace {

// "2 GiB" for whole GiB/MiB/KiB, else "N bytes".
std::string ByteCount(uint64_t n) {
  const char* units[] = {"GiB", "MiB", "KiB"};
  const int shifts[] = {30, 20, 10};
  for (int i = 0; i < 3; ++i) {
    const uint64_t unit = uint64_t{1} << shifts[i];
    if (n >= unit && n % unit == 0) return std::to_string(n / unit) + " " + units[i];
  }
  return std::to_string(n) + " bytes";
}

}  // namespace

Status CheckInputFile(const std::string& path, const std::string& what,
                      const std::string& expected, uint64_t max_bytes) {
  // Every message ends in what would be valid.
  const std::string want = " (expected " + expected + ")";
  const std::string tail = ", not a " + what + want;
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) return NotFoundError(path + ": does not exist" + want);
    if (err == EACCES) {
      return Status(StatusCode::kPermissionDenied,
                    path + ": cannot be read: " + std::strerror(err) +
                        ", a directory on the way cannot be searched" + want);
    }
    return InvalidArgumentError(path + ": cannot be checked: " + std::strerror(err) + want);
  }
  if (S_ISDIR(st.st_mode)) return InvalidArgumentError(path + ": is a directory" + tail);
  if (!S_ISREG(st.st_mode)) {
    const char* kind = S_ISFIFO(st.st_mode)   ? "a FIFO"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "not a regular file";
    return InvalidArgumentError(path + ": is " + kind + tail);
  }
  if (max_bytes > 0 && static_cast<uint64_t>(st.st_size) > max_bytes) {
    return InvalidArgumentError(path + ": " + std::to_string(st.st_size) + " bytes, more than the " +
                                ByteCount(max_bytes) + " a " + what + " may have" + want);
  }
  // Opened, not access()ed: access() answers for the real uid and ignores
  // ACLs some filesystems apply at open. A regular file opens at once
  // (O_NONBLOCK guards against the file having become a FIFO since stat).
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return NotFoundError(path + ": does not exist" + want);
    return Status(StatusCode::kPermissionDenied,
                  path + ": cannot be read: " + std::strerror(err) + want);
  }
  close(fd);
  return OkStatus();
}

StatusOr<std::string> ReadTextFile(const std::string& path, size_t max_bytes,
                                   const std::string& expected) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return NotFoundError(path + ": cannot open (missing?)");
  std::string text(max_bytes + 1, '\0');
  f.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (f.bad()) return DataLossError(path + ": read error");
  text.resize(static_cast<size_t>(f.gcount()));
  if (text.size() > max_bytes) {
    return DataLossError(path + ": longer than the limit of " + std::to_string(max_bytes) +
                         " bytes (expected " + expected + "); is it the right file?");
  }
  return text;
}

Status WriteFileAtomically(const std::string& path, const std::string& text, mode_t mode) {
  const std::string tmp = path + ".tmp";
  unlink(tmp.c_str());  // made anew below (O_EXCL): never through a planted link
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0) return InternalError("cannot write " + tmp + ": " + std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  const bool ok = close(fd) == 0 && done == text.size();
  if (!ok) {
    const int err = errno;
    unlink(tmp.c_str());
    return InternalError("write failed: " + tmp + ": " + std::strerror(err));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return InternalError("cannot rename " + tmp + " to " + path + ": " + std::strerror(err));
  }
  return OkStatus();
}

}  // namespace dgca
