#include "model/core/files.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

namespace dgca {
namespace {

std::string TempDir() {
  char tmpl[] = "/tmp/dgca-files-test-XXXXXX";
  EXPECT_NE(mkdtemp(tmpl), nullptr);
  return tmpl;
}

TEST(MakeDirectories, CreatesEveryMissingParentWithTheMode) {
  const std::string root = TempDir();
  const std::string deep = root + "/a/b/c";
  ASSERT_TRUE(MakeDirectories(deep, 0700).ok());
  struct stat st;
  ASSERT_EQ(stat(deep.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_TRUE(MakeDirectories(deep, 0700).ok());  // again: nothing to do
  EXPECT_TRUE(MakeDirectories(root + "/a/b/", 0755).ok());  // a trailing slash
  std::filesystem::remove_all(root);
}

TEST(MakeDirectories, NamesTheDirectoryItCouldNotMake) {
  const std::string root = TempDir();
  const std::string file = root + "/plain";
  std::FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  const Status s = MakeDirectories(file + "/sub", 0755);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "cannot create directory " + file + "/sub: Not a directory");
  const Status is_file = MakeDirectories(file, 0755);
  EXPECT_EQ(is_file.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(is_file.message(), file + " exists and is not a directory");
  EXPECT_EQ(MakeDirectories("", 0755).code(), StatusCode::kInvalidArgument);
  std::filesystem::remove_all(root);
}

void Touch(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr) << path;
  std::fputs(text.c_str(), f);
  std::fclose(f);
}

// Every refusal names the path, says what it found and what would be
// valid; nothing is opened that could block (a FIFO) or never end (a device).
TEST(CheckInputFile, RefusesWhatALoaderCouldNotReadWhole) {
  const std::string root = TempDir();
  const std::string file = root + "/vocab.txt";
  Touch(file, "[PAD]\n[UNK]\n");
  EXPECT_TRUE(CheckInputFile(file, "vocabulary file", "a vocab.txt").ok());

  const Status missing = CheckInputFile(root + "/none.txt", "vocabulary file", "a vocab.txt");
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.message(), root + "/none.txt: does not exist (expected a vocab.txt)");
  // A missing directory on the way, or a file used as one, is missing too.
  EXPECT_EQ(CheckInputFile(root + "/no/dir/x", "f", "e").code(), StatusCode::kNotFound);
  EXPECT_EQ(CheckInputFile(file + "/x", "f", "e").code(), StatusCode::kNotFound);

  const Status dir = CheckInputFile(root, "vocabulary file", "a vocab.txt");
  EXPECT_EQ(dir.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(dir.message(), root + ": is a directory, not a vocabulary file (expected a vocab.txt)");

  const std::string fifo = root + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const Status f = CheckInputFile(fifo, "data file", "lines");  // returns at once
  EXPECT_EQ(f.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.message(), fifo + ": is a FIFO, not a data file (expected lines)");
  EXPECT_NE(CheckInputFile("/dev/zero", "data file", "lines").message().find(
                "/dev/zero: is a character device, not a data file"),
            std::string::npos);

  // The size limit counts bytes; a limit of whole GiB/MiB/KiB is said so.
  Touch(file, std::string(2048, 'x'));
  EXPECT_TRUE(CheckInputFile(file, "data file", "small", 2048).ok());
  const Status big = CheckInputFile(file, "data file", "small", 1024);
  EXPECT_EQ(big.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(big.message(),
            file + ": 2048 bytes, more than the 1 KiB a data file may have (expected small)");

  // Unreadable by its mode (root reads anything: then there is nothing to see).
  if (geteuid() != 0) {
    ASSERT_EQ(chmod(file.c_str(), 0), 0);
    const Status denied = CheckInputFile(file, "data file", "readable");
    EXPECT_EQ(denied.code(), StatusCode::kPermissionDenied);
    EXPECT_NE(denied.message().find(file + ": cannot be read: Permission denied"),
              std::string::npos)
        << denied.message();
  }
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace dgca
