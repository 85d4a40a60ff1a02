#include "model/core/batch_io.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <type_traits>

namespace dgca {
namespace {

constexpr char kMagic[8] = {'D', 'G', 'C', 'A', 'B', 'A', 'T', '1'};

Status CheckSize(const char* name, size_t got, int64_t want) {
  if (static_cast<int64_t>(got) == want) return OkStatus();
  return InvalidArgumentError(std::string("batch record: ") + name + " has " +
                              std::to_string(got) + " elements, expected " + std::to_string(want));
}

}  // namespace

StatusOr<std::unique_ptr<BatchRecordWriter>> BatchRecordWriter::Open(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return NotFoundError("batch records: cannot create " + path + ": " + std::strerror(errno));
  if (std::fwrite(kMagic, 1, sizeof(kMagic), f) != sizeof(kMagic)) {
    std::fclose(f);
    return DataLossError("batch records: cannot write " + path);
  }
  return std::unique_ptr<BatchRecordWriter>(new BatchRecordWriter(path, f));
}

BatchRecordWriter::~BatchRecordWriter() {
  if (f_) std::fclose(f_);
}

Status BatchRecordWriter::Append(int64_t step, int micro, const Batch& b) {
  if (!f_) return FailedPreconditionError("batch records: " + path_ + " is closed");
  const int64_t BL = static_cast<int64_t>(b.batch_size) * b.seq_len;
  const int64_t T = b.num_slots();
  const int64_t K = b.top_k;
  DGCA_RETURN_IF_ERROR(CheckSize("input_ids", b.input_ids.size(), BL));
  DGCA_RETURN_IF_ERROR(CheckSize("attention_mask", b.attention_mask.size(), BL));
  DGCA_RETURN_IF_ERROR(CheckSize("prompt_slot", b.prompt_slot.size(), BL));
  DGCA_RETURN_IF_ERROR(CheckSize("labels", b.labels.size(), BL));
  DGCA_RETURN_IF_ERROR(CheckSize("mft_labels", b.mft_labels.size(), BL));
  DGCA_RETURN_IF_ERROR(CheckSize("slot_source_id", b.slot_source_id.size(), T));
  DGCA_RETURN_IF_ERROR(CheckSize("slot_target_id", b.slot_target_id.size(), T));
  DGCA_RETURN_IF_ERROR(CheckSize("candidates", b.candidates.size(), T * K));
  DGCA_RETURN_IF_ERROR(CheckSize("row_length", b.row_length.size(), b.batch_size));
  DGCA_RETURN_IF_ERROR(CheckSize("sample_index", b.sample_index.size(), b.batch_size));
  const int32_t header[8] = {static_cast<int32_t>(step), micro, b.batch_size, b.seq_len,
                             static_cast<int32_t>(T), static_cast<int32_t>(K), 0, 0};
  bool ok = std::fwrite(header, sizeof(header), 1, f_) == 1;
  auto put = [&](const auto& v) {
    if (ok && !v.empty()) ok = std::fwrite(v.data(), sizeof(v[0]), v.size(), f_) == v.size();
  };
  put(b.input_ids);
  put(b.attention_mask);
  put(b.prompt_slot);
  put(b.labels);
  put(b.mft_labels);
  put(b.slot_index);
  put(b.slot_source_id);
  put(b.slot_target_id);
  put(b.candidates);
  put(b.row_length);
  put(b.sample_index);
  if (!ok) return DataLossError("batch records: write to " + path_ + " failed: " + std::strerror(errno));
  return OkStatus();
}

Status BatchRecordWriter::Close() {
  if (!f_) return OkStatus();
  const bool ok = std::fclose(f_) == 0;
  f_ = nullptr;
  if (!ok) return DataLossError("batch records: closing " + path_ + " failed: " + std::strerror(errno));
  return OkStatus();
}

StatusOr<std::vector<BatchRecord>> ReadBatchRecords(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("batch records: cannot open " + path);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return DataLossError("batch records: " + path + " does not start with \"DGCABAT1\"");
  }
  std::vector<BatchRecord> out;
  size_t pos = sizeof(kMagic);
  while (pos < bytes.size()) {
    const size_t rec_start = pos;
    const std::string where = path + ": record " + std::to_string(out.size()) + " at byte " +
                              std::to_string(rec_start);
    auto take = [&](auto* v, int64_t n) -> Status {
      using E = typename std::remove_reference_t<decltype(*v)>::value_type;
      const size_t need = static_cast<size_t>(n) * sizeof(E);
      if (n < 0 || bytes.size() - pos < need) {
        return DataLossError("batch records: " + where + " is truncated (" +
                             std::to_string(bytes.size() - pos) + " bytes left, " +
                             std::to_string(need) + " needed)");
      }
      v->resize(static_cast<size_t>(n));
      if (need) std::memcpy(v->data(), bytes.data() + pos, need);
      pos += need;
      return OkStatus();
    };
    std::vector<int32_t> h;
    DGCA_RETURN_IF_ERROR(take(&h, 8));
    const int32_t B = h[2], L = h[3], T = h[4], K = h[5];
    if (h[0] < 0 || h[1] < 0 || B < 0 || L <= 0 || T < 0 || K < 0 || L > 1 << 16 ||
        B > 1 << 20 || static_cast<int64_t>(T) > static_cast<int64_t>(B) * L) {
      return DataLossError("batch records: " + where + " has impossible sizes (step " +
                           std::to_string(h[0]) + " micro " + std::to_string(h[1]) + " B " +
                           std::to_string(B) + " L " + std::to_string(L) + " T " +
                           std::to_string(T) + " K " + std::to_string(K) + ")");
    }
    BatchRecord r;
    r.step = h[0];
    r.micro = h[1];
    Batch& b = r.batch;
    b.batch_size = B;
    b.seq_len = L;
    b.top_k = K;
    const int64_t BL = static_cast<int64_t>(B) * L;
    DGCA_RETURN_IF_ERROR(take(&b.input_ids, BL));
    DGCA_RETURN_IF_ERROR(take(&b.attention_mask, BL));
    DGCA_RETURN_IF_ERROR(take(&b.prompt_slot, BL));
    DGCA_RETURN_IF_ERROR(take(&b.labels, BL));
    DGCA_RETURN_IF_ERROR(take(&b.mft_labels, BL));
    DGCA_RETURN_IF_ERROR(take(&b.slot_index, T));
    DGCA_RETURN_IF_ERROR(take(&b.slot_source_id, T));
    DGCA_RETURN_IF_ERROR(take(&b.slot_target_id, T));
    DGCA_RETURN_IF_ERROR(take(&b.candidates, static_cast<int64_t>(T) * K));
    DGCA_RETURN_IF_ERROR(take(&b.row_length, B));
    DGCA_RETURN_IF_ERROR(take(&b.sample_index, B));
    b.token_type_ids.assign(static_cast<size_t>(BL), 0);
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace dgca
