// `dgca export --checkpoint-dir` and `dgca correct` through RunCli, on a
// checkpoint this test writes (an untrained model: what is checked is the
// command, not the corrections): the output forms, and the errors with
// exit 2 that name what is wrong.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli/app.h"
#include "cli/cli_test_util.h"
#include "model/core/core_test_util.h"
#include "model/core/json.h"
#include "model/core/tokenizer.h"
#include "model/nn/model.h"
#include "model/train/checkpoint.h"

namespace dgca {
namespace cli {
namespace {

using testutil::MakeTempDir;
using testutil::WriteFile;

// DIR/ckpt with one step directory of a small random model, its
// vocab.txt beside it, and DIR/confusion.json.
std::string MakeCheckpointDir() {
  const std::string dir = MakeTempDir("model_commands_test");
  EXPECT_FALSE(dir.empty());
  const Vocab v = Vocab::BuildFromLines({"今天天气很好", "我们去公园玩"});
  ModelConfig c;
  c.vocab_size = v.size();
  c.hidden = 16;
  c.layers = 1;
  c.heads = 2;
  c.ffn = 32;
  c.max_position = 32;
  c.prompt_length = 1;
  c.candidate_top_k = 3;
  auto m = DgcaModel::Create(c, 1, 16, 3, 1);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  CheckpointState st;
  st.step = 7;
  EXPECT_TRUE(SaveCheckpoint(dir + "/ckpt", (*m)->params(), nullptr, c, st).ok());
  EXPECT_TRUE(v.Save(dir + "/ckpt/vocab.txt").ok());
  WriteFile(dir + "/confusion.json", "{\"天\": [\"田\"], \"气\": [\"汽\", \"器\"]}");
  return dir;
}

TEST(ModelCommandsTest, ExportACheckpointDirThenCorrect) {
  const std::string dir = MakeCheckpointDir();
  const std::string out = dir + "/model";
  CliRun e = Cli({"export", "--checkpoint-dir", dir + "/ckpt", "--out", out, "--max-seq-len", "20",
                  "--confusion", dir + "/confusion.json"});
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_NE(e.out.find("exported " + dir + "/ckpt, step-00000007, the latest of 1 checkpoint; none has an "
                       "eval recorded"),
            std::string::npos)
      << e.out;
  EXPECT_NE(e.out.find("model.safetensors  BERT encoder and MLM head"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("dgca_heads.safetensors"), std::string::npos) << e.out;
  for (const char* f : {"model.safetensors", "dgca_heads.safetensors", "config.json", "vocab.txt",
                        "confusion.json"}) {
    EXPECT_TRUE(std::filesystem::exists(out + "/" + f)) << f;
  }

  CliRun c = Cli({"correct", "--model", out, "今天天气很好", "我们 去公园"});
  ASSERT_EQ(c.code, 0) << c.err;
  std::istringstream lines(c.out);
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    ++n;
    const bool unchanged = line.find("  (no change)") != std::string::npos;
    const bool changed = line.find(" -> ") != std::string::npos && line.back() == ']';
    EXPECT_TRUE(unchanged != changed) << line;
  }
  EXPECT_EQ(n, 2) << c.out;

  CliRun j = Cli({"correct", "--model", out, "--json", "今天天气很好"});
  ASSERT_EQ(j.code, 0) << j.err;
  auto js = ParseJson(j.out, "correct --json");
  ASSERT_TRUE(js.ok()) << js.status().ToString() << "\n" << j.out;
  const JsonValue* s = js->Find("sentences");
  ASSERT_TRUE(s && s->is_array() && s->array.size() == 1) << j.out;
  EXPECT_EQ(s->array[0].Find("original")->string, "今天天气很好");
  EXPECT_TRUE(s->array[0].Find("corrected")->is_string());
  EXPECT_TRUE(s->array[0].Find("changes")->is_array());

  // From a file, one sentence per line.
  WriteFile(dir + "/in.txt", "今天\n很好\n");
  CliRun f = Cli({"correct", "--model", out, "--file", dir + "/in.txt"});
  ASSERT_EQ(f.code, 0) << f.err;
  EXPECT_EQ(std::count(f.out.begin(), f.out.end(), '\n'), 2) << f.out;

  // Too long for max_seq_len 20 with one prompt slot a side: (20 - 2 - 2) / 2 = 8.
  CliRun t = Cli({"correct", "--model", out, "--file", dir + "/long.txt"});
  EXPECT_EQ(t.code, 2);
  EXPECT_NE(t.err.find(dir + "/long.txt: no such file"), std::string::npos) << t.err;
  WriteFile(dir + "/long.txt", "好\n今天天气很好今天天气\n");
  t = Cli({"correct", "--model", out, "--file", dir + "/long.txt"});
  EXPECT_EQ(t.code, 2);
  EXPECT_NE(t.err.find(dir + "/long.txt:2: 10 characters; this model takes at most 8"),
            std::string::npos)
      << t.err;
}

TEST(ModelCommandsTest, ErrorsSayWhatIsMissing) {
  const std::string dir = MakeCheckpointDir();
  CliRun r = Cli({"correct", "--model", dir + "/nothing", "好"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("model directory " + dir + "/nothing does not exist"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("dgca export JOB --out"), std::string::npos) << r.err;

  r = Cli({"correct", "--model", dir + "/ckpt", "好"});  // a checkpoint, not an export
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(dir + "/ckpt/config.json: missing; is " + dir + "/ckpt a dgca export directory"),
            std::string::npos)
      << r.err;

  r = Cli({"correct", "好"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--model"), std::string::npos) << r.err;

  r = Cli({"export", "--out", dir + "/m"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("give a job (dgca export JOB --out DIR) or --checkpoint-dir PATH, not neither"),
            std::string::npos)
      << r.err;

  r = Cli({"export", "--checkpoint-dir", dir + "/none", "--out", dir + "/m"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("checkpoint directory " + dir + "/none does not exist"), std::string::npos) << r.err;

  r = Cli({"export", "--checkpoint-dir", dir + "/ckpt", "--out", dir + "/m", "--checkpoint", "newest"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--checkpoint newest: expected best, latest or a checkpoint step directory"),
            std::string::npos)
      << r.err;

  // Without a vocabulary beside the checkpoints, --vocab is asked for.
  std::filesystem::remove(dir + "/ckpt/vocab.txt");
  r = Cli({"export", "--checkpoint-dir", dir + "/ckpt", "--out", dir + "/m"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("no vocab.txt beside the checkpoints in " + dir + "/ckpt"), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace cli
}  // namespace dgca
