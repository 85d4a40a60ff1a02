// model/core/batch_io.h: recorded batches (dgca-train --dump-batches).
#include "model/core/batch_io.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)dgca::ReadBatchRecords(dgca::FuzzInputFile(data, size, ".batches"));
  return 0;
}
