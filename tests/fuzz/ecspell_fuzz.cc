// model/core/data.h: ECSpell "src<TAB>trg" files, then a training batch
// built from what they hold (MFT masking on).
#include <cstdlib>

#include "model/core/data.h"
#include "model/core/tokenizer.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const dgca::Vocab* vocab = [] {
    auto v = dgca::Vocab::Load(std::string(std::getenv("DGCA_FUZZ_VOCAB")));
    if (!v.ok()) std::abort();  // tools/fuzz.sh sets DGCA_FUZZ_VOCAB
    return new dgca::Vocab(std::move(*v));
  }();
  dgca::ReadStats stats;
  auto examples = dgca::ReadEcspell(dgca::FuzzInputFile(data, size, ".txt"), *vocab, 10, &stats);
  if (examples.ok() && !examples->empty()) {
    dgca::BatchOptions o;
    o.seq_len = 32;
    o.prompt_length = 3;
    o.top_k = 0;
    dgca::SetSpecialTokens(*vocab, &o);
    std::vector<int64_t> indices;
    for (int64_t i = 0; i < static_cast<int64_t>(examples->size()) && i < 4; ++i) indices.push_back(i);
    (void)dgca::BuildBatch(*examples, indices, o, nullptr, /*mft=*/true, /*epoch=*/0);
  }
  return 0;
}
