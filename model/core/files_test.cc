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

}  // namespace
}  // namespace dgca
