#include "model/core/safetensors.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <unistd.h>

#include "model/core/json.h"

namespace dgca {
namespace {

std::string TempPath(const std::string& name) {
  return "/tmp/dgca_st_" + std::to_string(getpid()) + "_" + name;
}

// Writes a raw safetensors file: length, header text, data bytes.
void WriteRaw(const std::string& path, const std::string& header, const std::string& data,
              int64_t length_override = -1) {
  std::ofstream out(path, std::ios::binary);
  uint64_t n = length_override >= 0 ? static_cast<uint64_t>(length_override) : header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
  out << header << data;
}

std::string Bytes(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }

TEST(SafetensorsTest, RoundTrip) {
  const std::string path = TempPath("rt.safetensors");
  std::vector<float> a = {1.0f, -2.5f, 3.25f, 0.0f, 1e-8f, -1e30f};
  std::vector<float> b = {42.0f};
  std::vector<TensorView> views = {{"z.weight", {2, 3}, a.data()},
                                   {"a.bias", {1}, b.data()},
                                   {"empty", {0, 4}, nullptr}};
  ASSERT_TRUE(WriteSafetensors(path, views, {{"format", "pt"}, {"note", "q\"uote"}}).ok());
  auto r = ReadSafetensors(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->tensors.size(), 3u);
  EXPECT_EQ(r->tensors["z.weight"].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(r->tensors["z.weight"].data, a);
  EXPECT_EQ(r->tensors["a.bias"].data, b);
  EXPECT_EQ(r->tensors["empty"].data.size(), 0u);
  EXPECT_EQ(r->metadata["format"], "pt");
  EXPECT_EQ(r->metadata["note"], "q\"uote");
  // Data section starts 8-byte aligned; tmp file is gone.
  std::ifstream in(path, std::ios::binary);
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  EXPECT_EQ(len[0] % 8, 0);
  EXPECT_NE(access((path + ".tmp").c_str(), F_OK), 0);
  std::remove(path.c_str());
}

TEST(SafetensorsTest, DuplicateNameRejectedOnWrite) {
  float x = 1;
  Status s = WriteSafetensors(TempPath("dup"), {{"a", {1}, &x}, {"a", {1}, &x}});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'a'"), std::string::npos);
}

TEST(SafetensorsTest, MissingFile) {
  auto r = ReadSafetensors("/nonexistent/x.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("/nonexistent/x.safetensors"), std::string::npos);
}

TEST(SafetensorsTest, TruncatedFile) {
  const std::string path = TempPath("trunc.safetensors");
  std::vector<float> a(100, 1.0f);
  ASSERT_TRUE(WriteSafetensors(path, {{"enc.w", {10, 10}, a.data()}}).ok());
  // Cut off the last 10 bytes of data.
  std::ifstream in(path, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), {});
  in.close();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << all.substr(0, all.size() - 10);
  }
  auto r = ReadSafetensors(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("enc.w"), std::string::npos) << r.status().message();
  // Truncated inside the header and inside the length.
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << all.substr(0, 20);
  }
  r = ReadSafetensors(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("truncated"), std::string::npos) << r.status().message();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << all.substr(0, 5);
  }
  r = ReadSafetensors(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("truncated"), std::string::npos);
  std::remove(path.c_str());
}

TEST(SafetensorsTest, BadJsonHeaderNamesPlace) {
  const std::string path = TempPath("badjson.safetensors");
  WriteRaw(path, "{\"a\": {\"dtype\": \"F32\",\n \"shape\": [1], \"data_offsets\": [0, 4]", "abcd");
  auto r = ReadSafetensors(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(path + " header:2:"), std::string::npos) << r.status().message();
  WriteRaw(path, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, x}", "abcd");
  r = ReadSafetensors(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("header:1:"), std::string::npos) << r.status().message();
  WriteRaw(path, "[1,2]", "");
  r = ReadSafetensors(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("object"), std::string::npos);
  // Absurd header length.
  WriteRaw(path, "{}", "", int64_t{1} << 50);
  r = ReadSafetensors(path);
  ASSERT_FALSE(r.ok());
  std::remove(path.c_str());
}

TEST(SafetensorsTest, OffsetsOutOfRange) {
  const std::string path = TempPath("offs.safetensors");
  WriteRaw(path, "{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
           std::string(8, '\0'));
  auto r = ReadSafetensors(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'w'"), std::string::npos);
  EXPECT_NE(r.status().message().find("outside"), std::string::npos) << r.status().message();
  WriteRaw(path, "{\"w\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [8, 4]}}",
           std::string(8, '\0'));
  r = ReadSafetensors(path);
  ASSERT_FALSE(r.ok());
  WriteRaw(path, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]}}",
           std::string(8, '\0'));
  r = ReadSafetensors(path);
  ASSERT_FALSE(r.ok());
  std::remove(path.c_str());
}

TEST(SafetensorsTest, ShapeByteMismatch) {
  const std::string path = TempPath("mismatch.safetensors");
  WriteRaw(path, "{\"layer.w\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 8]}}",
           std::string(8, '\0'));
  auto r = ReadSafetensors(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'layer.w'"), std::string::npos);
  EXPECT_NE(r.status().message().find("12"), std::string::npos) << r.status().message();
  WriteRaw(path, "{\"x\": {\"dtype\": \"I64\", \"shape\": [1], \"data_offsets\": [0, 8]}}",
           std::string(8, '\0'));
  r = ReadSafetensors(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("I64"), std::string::npos);
  EXPECT_NE(r.status().message().find("F32, F16, BF16"), std::string::npos);
  WriteRaw(path, "{\"x\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", std::string(4, '\0'));
  r = ReadSafetensors(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("shape"), std::string::npos);
  std::remove(path.c_str());
}

TEST(SafetensorsTest, F16AndBf16Decode) {
  const std::string path = TempPath("half.safetensors");
  // F16: 1.0=0x3C00, -2.0=0xC000, 65504=0x7BFF, smallest subnormal 0x0001,
  // +inf 0x7C00, 0.5 = 0x3800.
  const uint16_t f16[] = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x7C00, 0x3800};
  // BF16: 1.0=0x3F80, -3.0=0xC040, 0.15625=0x3E20.
  const uint16_t bf16[] = {0x3F80, 0xC040, 0x3E20};
  std::string data = Bytes(f16, sizeof f16) + Bytes(bf16, sizeof bf16);  // host is LE here
  WriteRaw(path,
           "{\"h\": {\"dtype\": \"F16\", \"shape\": [2, 3], \"data_offsets\": [0, 12]},"
           " \"b\": {\"dtype\": \"BF16\", \"shape\": [3], \"data_offsets\": [12, 18]}}",
           data);
  auto r = ReadSafetensors(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto& h = r->tensors["h"].data;
  ASSERT_EQ(h.size(), 6u);
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.0f);
  EXPECT_EQ(h[2], 65504.0f);
  EXPECT_EQ(h[3], std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(h[4]));
  EXPECT_EQ(h[5], 0.5f);
  const auto& b = r->tensors["b"].data;
  EXPECT_EQ(b, (std::vector<float>{1.0f, -3.0f, 0.15625f}));
  std::remove(path.c_str());
}

TEST(JsonTest, ParsesAndReportsPlaces) {
  auto r = ParseJson("{\"a\": [1, 2.5, -3e2, true, null, \"\\u4e2d\\n\"], \"b\": {}}", "t");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const JsonValue* a = r->Find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->array.size(), 6u);
  EXPECT_TRUE(a->array[0].is_integer);
  EXPECT_EQ(a->array[0].integer, 1);
  EXPECT_FALSE(a->array[1].is_integer);
  EXPECT_DOUBLE_EQ(a->array[2].number, -300.0);
  EXPECT_EQ(a->array[5].string, "\xe4\xb8\xad\n");
  auto bad = ParseJson("{\n  \"a\": [1,\n  2,,]}", "f.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("f.json:3:5"), std::string::npos) << bad.status().message();
  std::string deep(10000, '[');
  EXPECT_FALSE(ParseJson(deep, "deep").ok());
}

}  // namespace
}  // namespace dgca
