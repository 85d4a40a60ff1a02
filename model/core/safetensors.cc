#include "model/core/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>

#include <unistd.h>

#include "model/core/json.h"

namespace dgca {
namespace {

// Header larger than this is not a real checkpoint (HF caps it at 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

uint64_t ReadLe64(const unsigned char* p) {
  uint64_t x = 0;
  for (int i = 7; i >= 0; --i) x = (x << 8) | p[i];
  return x;
}

bool HostIsLittleEndian() {
  uint16_t x = 1;
  unsigned char c;
  std::memcpy(&c, &x, 1);
  return c == 1;
}

// IEEE half -> float, exact for every input (subnormals, inf, NaN).
float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {
      // Subnormal: normalise.
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      mant &= 0x3FF;
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float Bf16ToFloat(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

int DtypeSize(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  return 0;
}

void DecodeInto(const std::string& dtype, const unsigned char* src, size_t numel, float* dst) {
  if (numel == 0) return;
  if (dtype == "F32") {
    if (HostIsLittleEndian()) {
      std::memcpy(dst, src, numel * 4);
    } else {
      for (size_t i = 0; i < numel; ++i) {
        uint32_t b = src[4 * i] | src[4 * i + 1] << 8 | src[4 * i + 2] << 16 |
                     static_cast<uint32_t>(src[4 * i + 3]) << 24;
        std::memcpy(&dst[i], &b, 4);
      }
    }
    return;
  }
  const bool bf16 = dtype == "BF16";
  for (size_t i = 0; i < numel; ++i) {
    uint16_t h = static_cast<uint16_t>(src[2 * i] | src[2 * i + 1] << 8);
    dst[i] = bf16 ? Bf16ToFloat(h) : HalfToFloat(h);
  }
}

}  // namespace

StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(path + ": cannot open safetensors file");
  in.seekg(0, std::ios::end);
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0, std::ios::beg);
  if (file_size < 8) {
    return DataLossError(path + ": truncated safetensors file: " + std::to_string(file_size) +
                         " bytes, need at least 8 for the header length");
  }
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  const uint64_t header_len = ReadLe64(len_bytes);
  if (header_len > kMaxHeaderBytes) {
    return DataLossError(path + ": safetensors header length " + std::to_string(header_len) +
                         " bytes is larger than the 100 MiB limit (not a safetensors file?)");
  }
  if (header_len > file_size - 8) {
    return DataLossError(path + ": truncated safetensors file: header says " +
                         std::to_string(header_len) + " header bytes but the file has only " +
                         std::to_string(file_size - 8) + " after the length");
  }
  std::string header(header_len, '\0');
  in.read(&header[0], static_cast<std::streamsize>(header_len));
  if (!in) return DataLossError(path + ": short read in the safetensors header");
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = file_size - data_start;

  // JSON errors report "path header:line:col (byte N)"; byte N is within the
  // header, which starts at file byte 8.
  auto parsed = ParseJson(header, path + " header");
  if (!parsed.ok()) return parsed.status();
  const JsonValue& root = parsed.value();
  if (!root.is_object()) {
    return InvalidArgumentError(path + ": safetensors header must be a JSON object, found " +
                                JsonValue::TypeName(root.type));
  }

  SafetensorsFile out;
  std::set<std::string> seen;
  std::vector<unsigned char> buf;
  for (const auto& kv : root.object) {
    const std::string& name = kv.first;
    const JsonValue& v = kv.second;
    if (!seen.insert(name).second) {
      return InvalidArgumentError(path + ": tensor '" + name + "' appears twice in the header");
    }
    if (name == "__metadata__") {
      if (!v.is_object()) {
        return InvalidArgumentError(path + ": __metadata__ must be an object of strings");
      }
      for (const auto& m : v.object) {
        if (!m.second.is_string()) {
          return InvalidArgumentError(path + ": __metadata__ value '" + m.first +
                                      "' must be a string, found " +
                                      JsonValue::TypeName(m.second.type));
        }
        out.metadata[m.first] = m.second.string;
      }
      continue;
    }
    const std::string where = path + ": tensor '" + name + "'";
    if (!v.is_object()) {
      return InvalidArgumentError(where + ": header entry must be an object with dtype, shape and data_offsets");
    }
    const JsonValue* dtype = v.Find("dtype");
    const JsonValue* shape = v.Find("shape");
    const JsonValue* offsets = v.Find("data_offsets");
    if (dtype == nullptr || !dtype->is_string()) return InvalidArgumentError(where + ": missing string field 'dtype'");
    if (shape == nullptr || !shape->is_array()) return InvalidArgumentError(where + ": missing array field 'shape'");
    if (offsets == nullptr || !offsets->is_array() || offsets->array.size() != 2) {
      return InvalidArgumentError(where + ": 'data_offsets' must be an array [begin, end]");
    }
    const int esize = DtypeSize(dtype->string);
    if (esize == 0) {
      return InvalidArgumentError(where + ": unsupported dtype '" + dtype->string +
                                  "' (valid: F32, F16, BF16)");
    }
    Tensor t;
    uint64_t numel = 1;
    for (const JsonValue& d : shape->array) {
      if (!d.is_number() || !d.is_integer || d.integer < 0) {
        return InvalidArgumentError(where + ": shape entries must be non-negative integers");
      }
      t.shape.push_back(d.integer);
      // Guard the product against overflow: no real tensor has 2^40 elements.
      if (d.integer > 0 && numel > (uint64_t{1} << 40) / static_cast<uint64_t>(d.integer)) {
        return InvalidArgumentError(where + ": shape is too large");
      }
      numel *= static_cast<uint64_t>(d.integer);
    }
    int64_t se[2];
    for (int i = 0; i < 2; ++i) {
      const JsonValue& o = offsets->array[i];
      if (!o.is_number() || !o.is_integer || o.integer < 0) {
        return InvalidArgumentError(where + ": data_offsets must be non-negative integers");
      }
      se[i] = o.integer;
    }
    const uint64_t begin = static_cast<uint64_t>(se[0]), end = static_cast<uint64_t>(se[1]);
    if (begin > end) {
      return DataLossError(where + ": data_offsets [" + std::to_string(begin) + ", " +
                           std::to_string(end) + "] has begin after end");
    }
    if (end > data_size) {
      return DataLossError(where + ": data_offsets [" + std::to_string(begin) + ", " +
                           std::to_string(end) + "] outside the data section of " +
                           std::to_string(data_size) + " bytes (file truncated?)");
    }
    if (end - begin != numel * esize) {
      return DataLossError(where + ": shape and dtype " + dtype->string + " need " +
                           std::to_string(numel * esize) + " bytes but data_offsets span " +
                           std::to_string(end - begin));
    }
    buf.resize(end - begin);
    in.seekg(static_cast<std::streamoff>(data_start + begin));
    in.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
    if (!in) return DataLossError(where + ": short read of tensor data");
    t.data.resize(numel);
    DecodeInto(dtype->string, buf.data(), numel, t.data.data());
    out.tensors.emplace(name, std::move(t));
  }
  return out;
}

Status WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  std::vector<const TensorView*> sorted;
  sorted.reserve(tensors.size());
  for (const auto& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorView* a, const TensorView* b) { return a->name < b->name; });
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i]->name.empty() || sorted[i]->name == "__metadata__") {
      return InvalidArgumentError(path + ": invalid tensor name '" + sorted[i]->name + "'");
    }
    if (i > 0 && sorted[i]->name == sorted[i - 1]->name) {
      return InvalidArgumentError(path + ": tensor '" + sorted[i]->name + "' given twice");
    }
  }

  std::string header = "{";
  bool first = true;
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool mfirst = true;
    for (const auto& kv : metadata) {
      if (!mfirst) header += ",";
      mfirst = false;
      AppendJsonString(kv.first, &header);
      header += ":";
      AppendJsonString(kv.second, &header);
    }
    header += "}";
    first = false;
  }
  uint64_t offset = 0;
  std::vector<uint64_t> numels;
  for (const TensorView* t : sorted) {
    uint64_t numel = 1;
    for (int64_t d : t->shape) {
      if (d < 0) return InvalidArgumentError(path + ": tensor '" + t->name + "' has a negative dimension");
      numel *= static_cast<uint64_t>(d);
    }
    if (numel > 0 && t->data == nullptr) {
      return InvalidArgumentError(path + ": tensor '" + t->name + "' has no data");
    }
    numels.push_back(numel);
    if (!first) header += ",";
    first = false;
    AppendJsonString(t->name, &header);
    header += ":{\"dtype\":\"F32\",\"shape\":[";
    for (size_t i = 0; i < t->shape.size(); ++i) {
      if (i) header += ",";
      header += std::to_string(t->shape[i]);
    }
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(offset + numel * 4) + "]}";
    offset += numel * 4;
  }
  header += "}";
  // Pad with spaces so the data starts 8-byte aligned (as the reference writer does).
  while ((8 + header.size()) % 8 != 0) header.push_back(' ');

  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return UnavailableError(tmp + ": cannot open for writing: " + std::strerror(errno));
  bool ok = true;
  unsigned char len[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  ok = ok && std::fwrite(len, 1, 8, f) == 8;
  ok = ok && std::fwrite(header.data(), 1, header.size(), f) == header.size();
  const bool le = HostIsLittleEndian();
  std::vector<unsigned char> swap;
  for (size_t i = 0; ok && i < sorted.size(); ++i) {
    const uint64_t numel = numels[i];
    if (numel == 0) continue;
    if (le) {
      ok = std::fwrite(sorted[i]->data, 4, numel, f) == numel;
    } else {
      swap.resize(numel * 4);
      for (uint64_t k = 0; k < numel; ++k) {
        uint32_t b;
        std::memcpy(&b, &sorted[i]->data[k], 4);
        for (int j = 0; j < 4; ++j) swap[4 * k + j] = static_cast<unsigned char>(b >> (8 * j));
      }
      ok = std::fwrite(swap.data(), 1, swap.size(), f) == swap.size();
    }
  }
  ok = ok && std::fflush(f) == 0;
  ok = ok && fsync(fileno(f)) == 0;
  const int err = errno;
  if (std::fclose(f) != 0) ok = false;
  if (!ok) {
    std::remove(tmp.c_str());
    return UnavailableError(tmp + ": write failed: " + std::strerror(err));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    return UnavailableError("rename " + tmp + " -> " + path + " failed: " + std::strerror(e));
  }
  return OkStatus();
}

}  // namespace dgca
