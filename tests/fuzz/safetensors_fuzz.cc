// model/core/safetensors.h: checkpoints' and --init weights' files.
#include "model/core/safetensors.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)dgca::ReadSafetensors(dgca::FuzzInputFile(data, size, ".safetensors"));
  return 0;
}
