#include "spec/spec_files.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "spec/spec.h"

namespace dgca {
namespace {

std::string TempDir() {
  char tmpl[] = "/tmp/dgca-spec-files-test-XXXXXX";
  EXPECT_NE(mkdtemp(tmpl), nullptr);
  return tmpl;
}

void Touch(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr) << path;
  std::fputs("甲 乙\t甲 乙\n", f);
  std::fclose(f);
}

// Parses `yaml` (which must be valid) as DIR/job.yaml with base_dir DIR,
// as the CLI sends it.
v1::JobSpec Parse(const std::string& yaml, const std::string& dir) {
  auto r = ParseJobSpec(yaml, dir + "/job.yaml");
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(r->ok()) << FormatProblems(r->problems);
  v1::JobSpec spec = r->spec;
  spec.set_base_dir(dir);
  return spec;
}

const char kAllFiles[] =
    "name: files\n"                                   // 1
    "model:\n"                                        // 2
    "  preset: tiny\n"                                // 3
    "  vocab: vocab.txt\n"                            // 4
    "  init_from: /abs/bert.safetensors\n"            // 5
    "  heads: {candidate: {confusion: conf.json}}\n"  // 6
    "data:\n"                                         // 7
    "  train: train.txt\n"                            // 8
    "  eval: sub/eval.txt\n";                         // 9

TEST(SpecInputFiles, EveryPathFieldWithItsPlaceAndTheRanksPath) {
  const std::vector<v1::InputFile> in = SpecInputFiles(kAllFiles, Parse(kAllFiles, "/jobs"));
  ASSERT_EQ(in.size(), 5u);
  struct Want {
    const char* field;
    const char* path;
    int line, column;
    const char* kind;
  };
  const Want want[] = {
      // In line order, as the parser's problems are.
      {"model.vocab", "/jobs/vocab.txt", 4, 10, "vocab"},
      {"model.init_from", "/abs/bert.safetensors", 5, 14, "weights"},
      {"model.heads.candidate.confusion", "/jobs/conf.json", 6, 34, "confusion"},
      {"data.train", "/jobs/train.txt", 8, 10, "data"},
      {"data.eval", "/jobs/sub/eval.txt", 9, 9, "data"},
  };
  for (size_t i = 0; i < in.size(); ++i) {
    SCOPED_TRACE(want[i].field);
    EXPECT_EQ(in[i].field(), want[i].field);
    EXPECT_EQ(in[i].path(), want[i].path);
    EXPECT_EQ(in[i].line(), want[i].line);
    EXPECT_EQ(in[i].column(), want[i].column);
    EXPECT_EQ(in[i].kind(), want[i].kind);
    EXPECT_EQ(in[i].spec_file(), "/jobs/job.yaml");
    EXPECT_EQ(in[i].base_dir(), "/jobs");
  }
  EXPECT_EQ(in[0].written(), "vocab.txt");
}

TEST(SpecInputFiles, OnlyFilesTheRanksRead) {
  // Defaults (no vocab, random init, the built-in confusion set) are no files.
  const std::string none = "model: {preset: tiny, vocab: null}\n";
  EXPECT_TRUE(SpecInputFiles(none, Parse(none, "/j")).empty());
  // A disabled candidate head reads no confusion set.
  const std::string off =
      "model: {preset: tiny, heads: {candidate: {enabled: false, confusion: c.json}}}\n"
      "data: {train: t.txt}\n";
  const auto in = SpecInputFiles(off, Parse(off, "/j"));
  ASSERT_EQ(in.size(), 1u);
  EXPECT_EQ(in[0].field(), "data.train");
  // A comm probe trains nothing.
  const std::string probe = "kind: comm_probe\ndata: {train: t.txt}\n";
  EXPECT_TRUE(SpecInputFiles(probe, Parse(probe, "/j")).empty());
}

TEST(CheckInputFiles, NamesEveryUnreadableFileWithItsPlace) {
  const std::string dir = TempDir();
  Touch(dir + "/vocab.txt");
  mkdir((dir + "/conf.json").c_str(), 0755);  // a directory where a file belongs
  // train.txt and sub/eval.txt are missing; /abs/bert.safetensors too.
  const std::vector<v1::SpecProblem> p =
      CheckInputFiles(SpecInputFiles(kAllFiles, Parse(kAllFiles, dir)), "on this machine");
  ASSERT_EQ(p.size(), 4u);
  // An absolute path needs no word on how it resolved.
  const std::string weights = FormatProblem(p[0]);
  EXPECT_EQ(weights.rfind(dir + "/job.yaml:5:14: model.init_from: /abs/bert.safetensors: does not exist", 0),
            0u)
      << weights;
  EXPECT_EQ(weights.find("relative"), std::string::npos) << weights;
  EXPECT_EQ(FormatProblem(p[1]).rfind(dir + "/job.yaml:6:34: model.heads.candidate.confusion: " +
                                          dir + "/conf.json: is a directory, not a confusion-set file",
                                      0),
            0u)
      << FormatProblem(p[1]);
  const std::string train = FormatProblem(p[2]);
  EXPECT_EQ(train.rfind(dir + "/job.yaml:8:10: data.train: " + dir + "/train.txt: does not exist", 0),
            0u)
      << train;
  // What would be valid, where it was looked for, and how the path came about.
  EXPECT_NE(train.find("expected a readable regular file of lines 'src<TAB>trg' of at most 2 GiB, which the "
                       "loader holds in memory)"),
            std::string::npos)
      << train;
  EXPECT_NE(train.find("checked on this machine"), std::string::npos) << train;
  EXPECT_NE(train.find("'train.txt' is relative, so it is taken from the spec file's directory " + dir),
            std::string::npos)
      << train;
  EXPECT_EQ(FormatProblem(p[3]).rfind(dir + "/job.yaml:9:9: data.eval: " + dir + "/sub/eval.txt", 0),
            0u)
      << FormatProblem(p[3]);

  // The data files take the loader's own rules: no FIFO (it would block).
  const std::string spec = "data: {train: fifo.txt}\n";
  ASSERT_EQ(mkfifo((dir + "/fifo.txt").c_str(), 0600), 0);
  const auto fifo = CheckInputFiles(SpecInputFiles(spec, Parse(spec, dir)), "here");
  ASSERT_EQ(fifo.size(), 1u);
  EXPECT_NE(fifo[0].message().find("is a FIFO, not a data file"), std::string::npos)
      << fifo[0].message();

  // Files that are there pass.
  Touch(dir + "/train.txt");
  const std::string ok = "model: {preset: tiny, vocab: vocab.txt}\ndata: {train: train.txt}\n";
  EXPECT_TRUE(CheckInputFiles(SpecInputFiles(ok, Parse(ok, dir)), "here").empty());
  std::filesystem::remove_all(dir);
}

TEST(CheckInputFiles, WithoutABaseDirectoryTheWorkingDirectorySaysSo) {
  const std::string spec = "data: {train: surely-not-here.txt}\n";
  v1::JobSpec s = Parse(spec, "");
  const auto p = CheckInputFiles(SpecInputFiles(spec, s), "on node n1 by its agent");
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].message().find("the spec came without its directory, so it is taken from the "
                                "working directory"),
            std::string::npos)
      << p[0].message();
  EXPECT_NE(p[0].message().find("checked on node n1 by its agent"), std::string::npos);
}

TEST(InputProblemsMessage, CountThenOneLocatedLineEach) {
  v1::SpecProblem a, b;
  a.set_file("j.yaml");
  a.set_line(3);
  a.set_column(10);
  a.set_field("data.train");
  a.set_message("x: does not exist");
  b = a;
  b.set_field("data.eval");
  b.set_line(4);
  EXPECT_EQ(InputProblemsMessage({a, b}, "on node n1"),
            "2 input files of the job cannot be read on node n1:\n"
            "j.yaml:3:10: data.train: x: does not exist\n"
            "j.yaml:4:10: data.eval: x: does not exist");
}

TEST(ResolveSpecPath, RelativeAgainstTheBaseDirectory) {
  EXPECT_EQ(ResolveSpecPath("/a", "b.txt"), "/a/b.txt");
  EXPECT_EQ(ResolveSpecPath("/a/", "b.txt"), "/a/b.txt");
  EXPECT_EQ(ResolveSpecPath("/a", "/c/b.txt"), "/c/b.txt");
  EXPECT_EQ(ResolveSpecPath("", "b.txt"), "b.txt");
  EXPECT_EQ(ResolveSpecPath("/a", ""), "");
}

}  // namespace
}  // namespace dgca
