// Small filesystem helpers for libdgca_model and the programs above it
// (model/ builds without Abseil, so these return dgca::Status; the control
// plane converts with ToAbsl, proto/rpc/rpc_util.h).
//
// Thread-safety: pure functions over the filesystem.
#ifndef DGCA_MODEL_CORE_FILES_H_
#define DGCA_MODEL_CORE_FILES_H_

#include <string>

#include "model/core/status.h"

namespace dgca {

// Creates `path` and each missing parent (mkdir -p), new directories with
// `mode`; directories that exist already are fine. FAILED_PRECONDITION
// "cannot create directory D: <strerror>" naming the first one that could
// not be made, or "PATH exists and is not a directory"; INVALID_ARGUMENT for
// an empty path.
Status MakeDirectories(const std::string& path, int mode);

}  // namespace dgca

#endif  // DGCA_MODEL_CORE_FILES_H_
