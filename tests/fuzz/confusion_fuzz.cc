// model/core/confusion.h: confusion-set JSON files.
#include <cstdlib>

#include "model/core/confusion.h"
#include "model/core/tokenizer.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const dgca::Vocab* vocab = [] {
    auto v = dgca::Vocab::Load(std::string(std::getenv("DGCA_FUZZ_VOCAB")));
    if (!v.ok()) std::abort();
    return new dgca::Vocab(std::move(*v));
  }();
  (void)dgca::ConfusionSet::LoadJson(dgca::FuzzInputFile(data, size, ".json"), *vocab);
  return 0;
}
