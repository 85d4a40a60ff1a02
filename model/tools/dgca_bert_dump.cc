// dgca-bert-dump: the BERT part of an exported model (dgca export) run by
// our CPU code on some sentences, written as a safetensors file for
// tests/golden/check_export.py to hold Hugging Face transformers'
// BertForMaskedLM, loaded from the same export, against. A developer tool:
// nothing at run time uses it.
//
//   dgca-bert-dump --model DIR --out FILE [--threads N] SENTENCE...
//
// Two batches, each [B, L] with every row's hidden states and MLM logits:
//   plain.*  "[CLS] s1..sn [SEP] [PAD]..." with token type 0: what
//            BertForMaskedLM computes from input_ids alone
//   relm.*   the ReLM rows the trainer and `dgca correct` build (BuildBatch),
//            whose 2P prompt slots take the prompt encoder's rows
//            (relm.prompt_rows [2P, H], relm.prompt_slot) instead of their
//            word embeddings: BertForMaskedLM with inputs_embeds.
// Tensors (F32; ids as floats): {plain,relm}.{input_ids, attention_mask,
// token_type_ids, hidden, logits}, relm.prompt_slot, relm.prompt_rows.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "model/core/data.h"
#include "model/core/safetensors.h"
#include "model/cpu/thread_pool.h"
#include "model/nn/bert.h"
#include "model/nn/prompt_encoder.h"
#include "model/train/export.h"

namespace dgca {
namespace {

std::vector<float> AsFloat(const std::vector<int32_t>& v) { return std::vector<float>(v.begin(), v.end()); }

struct Net {
  ParamStore store;
  std::unique_ptr<Bert> bert;
  std::unique_ptr<PromptEncoder> prompt;
};

// Our Bert and PromptEncoder, declared as DgcaModel declares them, with the
// export's values copied in by name.
StatusOr<std::unique_ptr<Net>> MakeNet(const ExportedModel& m, int B, int L) {
  auto net = std::make_unique<Net>();
  net->bert = std::make_unique<Bert>(m.config, B, L, B * L);
  net->prompt = std::make_unique<PromptEncoder>(m.config);
  DGCA_RETURN_IF_ERROR(net->bert->DeclareWordEmbeddings(&net->store));
  DGCA_RETURN_IF_ERROR(net->prompt->Declare(&net->store));
  DGCA_RETURN_IF_ERROR(net->bert->DeclareBody(&net->store));
  DGCA_RETURN_IF_ERROR(net->bert->DeclareMlmHead(&net->store));
  net->store.Finalize();
  DGCA_RETURN_IF_ERROR(net->bert->Bind(&net->store));
  DGCA_RETURN_IF_ERROR(net->prompt->Bind(&net->store));
  const ParamStore& from = m.model->params();
  for (int i = 0; i < net->store.size(); ++i) {
    const ParamInfo& p = net->store.info(i);
    const int j = from.Find(p.name);
    if (j < 0) return NotFoundError("the export has no parameter " + p.name);
    std::copy(from.value(j), from.value(j) + p.numel, net->store.value(i));
  }
  return net;
}

void Add(std::vector<TensorView>* views, std::vector<std::vector<float>>* keep, const std::string& name,
         std::vector<int64_t> shape, std::vector<float> data) {
  keep->push_back(std::move(data));
  views->push_back({name, std::move(shape), keep->back().data()});
}

int Run(int argc, char** argv) {
  std::string model_dir, out;
  int threads = 1;
  std::vector<std::string> sentences;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model" && i + 1 < argc) {
      model_dir = argv[++i];
    } else if (a == "--out" && i + 1 < argc) {
      out = argv[++i];
    } else if (a == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else {
      sentences.push_back(a);
    }
  }
  if (model_dir.empty() || out.empty() || sentences.empty() || threads < 1) {
    std::fprintf(stderr, "usage: dgca-bert-dump --model DIR --out FILE [--threads N] SENTENCE...\n");
    return 2;
  }
  auto m = LoadExportedModel(model_dir, 1, 1);
  if (!m.ok()) {
    std::fprintf(stderr, "error: %s\n", m.status().ToString().c_str());
    return 1;
  }
  const int B = static_cast<int>(sentences.size());
  const int L = m->max_seq_len;
  const int max_chars = MaxCharsForSeqLen(L, m->config.prompt_length);
  std::vector<Example> examples;
  for (const std::string& s : sentences) {
    Example ex;
    for (const std::string& ch : [&] {
           std::vector<std::string> chars;
           for (size_t p = 0; p < s.size();) {
             size_t n = 1;
             const unsigned char c = static_cast<unsigned char>(s[p]);
             if (c >= 0xF0) n = 4; else if (c >= 0xE0) n = 3; else if (c >= 0xC0) n = 2;
             if (s[p] != ' ') chars.push_back(s.substr(p, n));
             p += n;
           }
           return chars;
         }()) {
      ex.src.push_back(m->vocab.Lookup(ch));
    }
    if (static_cast<int>(ex.src.size()) > max_chars) ex.src.resize(max_chars);
    ex.trg = ex.src;
    examples.push_back(std::move(ex));
  }
  auto net = MakeNet(*m, B, L);
  if (!net.ok()) {
    std::fprintf(stderr, "error: %s\n", net.status().ToString().c_str());
    return 1;
  }
  cpu::ThreadPool pool(threads);
  cpu::Context ctx{&pool};
  Bert& bert = *(*net)->bert;
  const int H = m->config.hidden, V = m->config.vocab_size;
  std::vector<TensorView> views;
  std::vector<std::vector<float>> keep;
  keep.reserve(32);
  std::vector<int32_t> rows(static_cast<size_t>(B) * L);
  for (int i = 0; i < B * L; ++i) rows[i] = i;

  // plain: [CLS] s [SEP], padded.
  {
    std::vector<int32_t> ids(static_cast<size_t>(B) * L, m->vocab.pad_id()), mask(ids.size(), 0),
        types(ids.size(), 0);
    for (int b = 0; b < B; ++b) {
      const std::vector<int32_t>& s = examples[b].src;
      const int n = std::min<int>(static_cast<int>(s.size()), L - 2);
      ids[b * L] = m->vocab.cls_id();
      for (int i = 0; i < n; ++i) ids[b * L + 1 + i] = s[i];
      ids[b * L + 1 + n] = m->vocab.sep_id();
      for (int i = 0; i < n + 2; ++i) mask[b * L + i] = 1;
    }
    bert.EmbedForward(ctx, ids.data(), types.data(), nullptr, nullptr, B, L);
    bert.EncoderForward(ctx, mask.data(), B, L);
    std::vector<float> hidden(bert.hidden(), bert.hidden() + static_cast<size_t>(B) * L * H);
    const float* logits = bert.MlmHeadForward(ctx, rows.data(), B * L);
    Add(&views, &keep, "plain.input_ids", {B, L}, AsFloat(ids));
    Add(&views, &keep, "plain.attention_mask", {B, L}, AsFloat(mask));
    Add(&views, &keep, "plain.token_type_ids", {B, L}, AsFloat(types));
    Add(&views, &keep, "plain.hidden", {B, L, H}, std::move(hidden));
    Add(&views, &keep, "plain.logits", {B, L, V},
        std::vector<float>(logits, logits + static_cast<size_t>(B) * L * V));
  }
  // relm: the rows BuildBatch makes, prompts from the prompt encoder.
  {
    BatchOptions o;
    o.seq_len = L;
    o.prompt_length = m->config.prompt_length;
    o.top_k = 0;
    SetSpecialTokens(m->vocab, &o);
    std::vector<int64_t> idx;
    for (int b = 0; b < B; ++b) idx.push_back(b);
    Batch batch = BuildBatch(examples, idx, o, nullptr, /*mft=*/false, /*epoch=*/0);
    const float* prompt_rows = (*net)->prompt->Forward();
    const int S = 2 * m->config.prompt_length;
    bert.EmbedForward(ctx, batch.input_ids.data(), batch.token_type_ids.data(), batch.prompt_slot.data(),
                      prompt_rows, B, L);
    bert.EncoderForward(ctx, batch.attention_mask.data(), B, L);
    std::vector<float> hidden(bert.hidden(), bert.hidden() + static_cast<size_t>(B) * L * H);
    const float* logits = bert.MlmHeadForward(ctx, rows.data(), B * L);
    Add(&views, &keep, "relm.input_ids", {B, L}, AsFloat(batch.input_ids));
    Add(&views, &keep, "relm.attention_mask", {B, L}, AsFloat(batch.attention_mask));
    Add(&views, &keep, "relm.token_type_ids", {B, L}, AsFloat(batch.token_type_ids));
    Add(&views, &keep, "relm.prompt_slot", {B, L}, AsFloat(batch.prompt_slot));
    if (prompt_rows != nullptr && S > 0) {
      Add(&views, &keep, "relm.prompt_rows", {S, H},
          std::vector<float>(prompt_rows, prompt_rows + static_cast<size_t>(S) * H));
    }
    Add(&views, &keep, "relm.hidden", {B, L, H}, std::move(hidden));
    Add(&views, &keep, "relm.logits", {B, L, V},
        std::vector<float>(logits, logits + static_cast<size_t>(B) * L * V));
  }
  Status w = WriteSafetensors(out, views, {{"format", "pt"}});
  if (!w.ok()) {
    std::fprintf(stderr, "error: %s\n", w.ToString().c_str());
    return 1;
  }
  std::printf("wrote %s: %d sentences, seq %d, hidden %d, vocab %d\n", out.c_str(), B, L, H, V);
  return 0;
}

}  // namespace
}  // namespace dgca

int main(int argc, char** argv) { return dgca::Run(argc, argv); }
