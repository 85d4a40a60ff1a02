// model/core/tokenizer.h: BERT vocab.txt files.
#include "model/core/tokenizer.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)dgca::Vocab::Load(dgca::FuzzInputFile(data, size, ".vocab"));
  return 0;
}
