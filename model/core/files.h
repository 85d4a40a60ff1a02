// Small filesystem helpers for libdgca_model and the programs above it
// (model/ builds without Abseil, so these return dgca::Status; the control
// plane converts with ToAbsl, proto/rpc/rpc_util.h).
//
// Thread-safety: pure functions over the filesystem.
#ifndef DGCA_MODEL_CORE_FILES_H_
#define DGCA_MODEL_CORE_FILES_H_

#include <cstdint>
#include <sys/types.h>

#include <string>

#include "model/core/status.h"

namespace dgca {

// Creates `path` and each missing parent (mkdir -p), new directories with
// `mode`; directories that exist already are fine. FAILED_PRECONDITION
// "cannot create directory D: <strerror>" naming the first one that could
// not be made, or "PATH exists and is not a directory"; INVALID_ARGUMENT for
// an empty path.
Status MakeDirectories(const std::string& path, int mode);

// Whether `path` names an input file a loader can read whole, checked
// without reading it: it exists, is a regular file, this process may open it
// for reading and, when `max_bytes` > 0, it holds at most that many bytes.
// A directory, FIFO, device or socket is refused before anything opens it:
// opening a FIFO blocks for ever and /dev/zero never ends. ReadEcspell
// checks its data files with it (CheckDataFile, model/core/data.h), and the
// job-spec check (spec/spec_files.h) every file a spec names, on the node
// the ranks read from, so both refuse the same files. `what` names the file
// ("data file"), `expected` says what would be valid ("a regular file of
// lines 'src<TAB>trg'"). Errors, each "PATH: ... (expected EXPECTED)":
//   NOT_FOUND          "does not exist" (also when a parent is missing)
//   PERMISSION_DENIED  "cannot be read: <strerror>" (its mode, or a parent
//                      directory that cannot be searched)
//   INVALID_ARGUMENT   "is a directory, not a WHAT", "is a FIFO, not a
//                      WHAT" (a device, a socket), or "N bytes, more than
//                      the 2 GiB a WHAT may have"
Status CheckInputFile(const std::string& path, const std::string& what,
                      const std::string& expected, uint64_t max_bytes = 0);

// Reads at most `max_bytes` of `path`: a larger file (a symlink to
// /dev/zero, the wrong file) is DATA_LOSS naming the file and the limit,
// never an unbounded read. `expected` says what the file should hold. A file
// that cannot be opened is NOT_FOUND "PATH: cannot open (missing?)".
StatusOr<std::string> ReadTextFile(const std::string& path, size_t max_bytes,
                                   const std::string& expected);

// Writes `text` to PATH.tmp, then renames it to `path`: a reader sees the
// old file or the whole new one, never a half-written one. PATH.tmp is
// made anew with `mode` (less the umask), never written through a link
// planted there. INTERNAL naming the file on a failed write or rename.
Status WriteFileAtomically(const std::string& path, const std::string& text,
                           mode_t mode = 0666);

}  // namespace dgca

#endif  // DGCA_MODEL_CORE_FILES_H_
