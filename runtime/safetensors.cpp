#include "runtime/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/bf16.h"
#include "core/error.h"
#include "core/mix64.h"

namespace trainer {

size_t safetensors_dtype_size(const std::string& dtype) {
  static const std::map<std::string, size_t> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"U16", 2},  {"I16", 2}, {"F16", 2}, {"BF16", 2},    {"U32", 4},
      {"I32", 4},  {"F32", 4}, {"U64", 8}, {"I64", 8},     {"F64", 8}};
  auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------------------------------------
// Checksum

namespace {

constexpr size_t kChunk = size_t(1) << 20;
constexpr uint64_t kP1 = 0x9e3779b185ebca87ULL;
constexpr uint64_t kP2 = 0xc2b2ae3d27d4eb4fULL;

// acc' = rotl(acc + w * P2, 31) * P1 is a bijection of w for a fixed acc and of acc for a fixed
// w, so changing any one word changes its lane's final value, and the mix chain below keeps that.
inline uint64_t round64(uint64_t acc, uint64_t w) { return std::rotl(acc + w * kP2, 31) * kP1; }

inline uint64_t load64(const uint8_t* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}

// Hash of one chunk of up to kChunk bytes: four independent lanes over 32-byte stripes, the tail
// zero-padded into a last stripe, then the lanes and the length mixed together.
uint64_t chunk_hash(const uint8_t* p, size_t n) {
  uint64_t v[4] = {kP1 + kP2, kP2, 0, 0 - kP1};
  size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int l = 0; l < 4; ++l) v[l] = round64(v[l], load64(p + i + 8 * l));
  if (i < n) {
    uint8_t tail[32] = {};
    std::memcpy(tail, p + i, n - i);
    for (int l = 0; l < 4; ++l) v[l] = round64(v[l], load64(tail + 8 * l));
  }
  uint64_t h = mix64(v[0] ^ n);
  for (int l = 1; l < 4; ++l) h = mix64(h ^ v[l]);
  return h;
}

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }

}  // namespace

uint64_t checksum64(const void* data, size_t n) { return checksum64({{data, n}}); }

uint64_t checksum64(const std::vector<ByteSpan>& pieces) {
  uint64_t total = 0;
  for (const ByteSpan& p : pieces) total += p.size;
  Checksum64 h(total);
  for (const ByteSpan& p : pieces) h.update(p.data, p.size);
  return h.value();
}

// The chunk hashes are chained in order (combine's loop), seeded by the total length.
Checksum64::Checksum64(uint64_t total) : total_(total), h_(mix64(0x7472616e6572ULL ^ total)) {}

void Checksum64::add_chunks(const uint8_t* p, size_t n) {
  const int64_t chunks = static_cast<int64_t>((n + kChunk - 1) / kChunk);
  std::vector<uint64_t> hashes(chunks);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t b = size_t(c) * kChunk;
    hashes[c] = chunk_hash(p + b, std::min(kChunk, n - b));
  }
  for (uint64_t c : hashes) h_ = mix64(h_ ^ c) + kP1;
}

void Checksum64::update(const void* data, size_t n) {
  TRAINER_CHECK(seen_ + n <= total_, "checksum fed {} bytes past its total {}", seen_ + n - total_,
                total_);
  const auto* p = static_cast<const uint8_t*>(data);
  seen_ += n;
  if (!carry_.empty()) {  // finish the started chunk first
    const size_t take = std::min(n, kChunk - carry_.size());
    carry_.insert(carry_.end(), p, p + take);
    p += take;
    n -= take;
    if (carry_.size() < kChunk) return;
    add_chunks(carry_.data(), kChunk);
    carry_.clear();
  }
  const size_t whole = n / kChunk * kChunk;
  add_chunks(p, whole);
  carry_.assign(p + whole, p + n);
}

uint64_t Checksum64::value() {
  TRAINER_CHECK(seen_ == total_, "checksum fed {} of {} bytes", seen_, total_);
  if (!carry_.empty()) add_chunks(carry_.data(), carry_.size());
  carry_.clear();
  return mix64(h_);
}

// ---------------------------------------------------------------------------------------------
// Reader

namespace {

uint64_t load_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

// safetensors refuses headers above 100 MB; so do we, before allocating for one.
constexpr uint64_t kMaxHeader = 100'000'000;

}  // namespace

SafetensorsReader SafetensorsReader::open(const std::string& path) {
  SafetensorsReader r;
  r.file_ = MappedFile::open(path, "safetensors file");
  const uint8_t* b = r.file_.bytes();
  const uint64_t size = r.file_.size();
  if (size < 8)
    usage_error("safetensors file '{}' is truncated: {} bytes, less than the 8-byte header length",
                path, size);
  const uint64_t n = load_le64(b);
  if (n > size - 8)
    usage_error("safetensors file '{}' is truncated: header length {} but only {} bytes follow",
                path, n, size - 8);
  if (n > kMaxHeader)
    usage_error("safetensors file '{}': header length {} exceeds the 100 MB limit", path, n);

  const char* hb = reinterpret_cast<const char*>(b + 8);
  nlohmann::json header = nlohmann::json::parse(hb, hb + n, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded())
    usage_error("safetensors file '{}': the header is not valid JSON (truncated or corrupt)", path);
  if (!header.is_object())
    usage_error("safetensors file '{}': the header is not a JSON object", path);

  r.data_ = b + 8 + n;
  r.data_size_ = size - 8 - n;
  for (auto& [key, val] : header.items()) {
    if (key == "__metadata__") {
      if (!val.is_object())
        usage_error("safetensors file '{}': __metadata__ is not an object", path);
      for (auto& [mk, mv] : val.items()) {
        if (!mv.is_string())
          usage_error("safetensors file '{}': metadata '{}' is not a string", path, mk);
        r.metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& why) {
      usage_error("safetensors file '{}': tensor '{}' {}", path, key, why);
    };
    if (!val.is_object()) bad("is not a JSON object");
    TensorInfo t;
    t.name = key;
    auto dt = val.find("dtype"), sh = val.find("shape"), off = val.find("data_offsets");
    if (dt == val.end() || !dt->is_string()) bad("lacks a string 'dtype'");
    if (sh == val.end() || !sh->is_array()) bad("lacks a 'shape' array");
    if (off == val.end() || !off->is_array() || off->size() != 2 ||
        !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned())
      bad("lacks 'data_offsets' [begin, end]");
    t.dtype = dt->get<std::string>();
    const size_t esize = safetensors_dtype_size(t.dtype);
    if (esize == 0) bad(fmt::format("has unknown dtype '{}'", t.dtype));
    unsigned __int128 bytes = esize;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned()) bad(fmt::format("has a bad shape {}", sh->dump()));
      const uint64_t dim = d.get<uint64_t>();
      if (dim > uint64_t(INT64_MAX)) bad(fmt::format("has a bad shape {}", sh->dump()));
      t.shape.push_back(static_cast<int64_t>(dim));
      bytes *= dim;
      if (bytes > size) bytes = static_cast<unsigned __int128>(size) + 1;  // too big either way
    }
    t.begin = (*off)[0].get<uint64_t>();
    t.end = (*off)[1].get<uint64_t>();
    if (t.begin > t.end)
      bad(fmt::format("has data_offsets [{}, {}] with begin > end", t.begin, t.end));
    if (t.end > r.data_size_)
      bad(
          fmt::format("ends at byte {} but the data section has only {} bytes (truncated file or "
                      "bad offsets)",
                      t.end, r.data_size_));
    if (bytes != t.end - t.begin)
      bad(fmt::format("has {} bytes but shape {} of {} needs {}", t.end - t.begin,
                      shape_string(t.shape), t.dtype, static_cast<uint64_t>(bytes)));
    r.tensors_.emplace(key, std::move(t));
  }

  // The data section must be exactly the tensors, back to back (as safetensors requires).
  std::vector<const TensorInfo*> by_offset;
  for (const auto& [name, t] : r.tensors_) by_offset.push_back(&t);
  std::stable_sort(by_offset.begin(), by_offset.end(),
                   [](const TensorInfo* a, const TensorInfo* b) {
                     return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
                   });
  uint64_t at = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo* t : by_offset) {
    if (t->begin < at)
      usage_error("safetensors file '{}': tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", path,
                  prev->name, prev->begin, prev->end, t->name, t->begin, t->end);
    if (t->begin > at)
      usage_error("safetensors file '{}': gap of {} bytes before tensor '{}' (bad offsets)", path,
                  t->begin - at, t->name);
    at = t->end;
    prev = t;
    r.order_.push_back(t->name);
  }
  if (at != r.data_size_)
    usage_error("safetensors file '{}': the data section has {} bytes but the tensors end at {}",
                path, r.data_size_, at);

  auto ck = r.metadata_.find(kChecksumKey);
  if (ck != r.metadata_.end()) {
    const std::string want = ck->second;
    if (want.size() != 16 || want.find_first_not_of("0123456789abcdef") != std::string::npos)
      usage_error("safetensors file '{}': metadata {} = '{}' is not 16 hex digits", path,
                  kChecksumKey, want);
    const std::string got = hex64(checksum64(r.data_, r.data_size_));
    if (got != want)
      usage_error("safetensors file '{}' is corrupt: checksum mismatch (stored {}, computed {})",
                  path, want, got);
  }
  return r;
}

const TensorInfo& SafetensorsReader::info(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) usage_error("safetensors file '{}' has no tensor '{}'", path(), name);
  return it->second;
}

void SafetensorsReader::read_f32(const std::string& name,
                                 const std::vector<int64_t>& expected_shape, float* out,
                                 int64_t first, int64_t count) const {
  const TensorInfo& t = info(name);
  if (t.dtype != "F32")
    usage_error("safetensors file '{}': tensor '{}' has dtype {} (need F32)", path(), name,
                t.dtype);
  if (t.shape != expected_shape)
    usage_error("safetensors file '{}': tensor '{}' has shape {}, expected {}", path(), name,
                shape_string(t.shape), shape_string(expected_shape));
  const int64_t n = t.numel();
  if (count < 0) count = n - first;
  TRAINER_CHECK(first >= 0 && first + count <= n, "elements [{}, {}) of tensor '{}' of {}", first,
                first + count, name, n);
  if (count > 0) std::memcpy(out, data_ + t.begin + first * 4, count * 4);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  int32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | mant << 13);  // inf, NaN
  if (exp == 0) {
    if (mant == 0) return std::bit_cast<float>(sign);  // +-0
    // Subnormal, mant * 2^-24: normal in fp32's wider exponent range.
    exp = 1;
    while (!(mant & 0x400)) {
      mant <<= 1;
      --exp;
    }
    mant &= 0x3ff;
  }
  return std::bit_cast<float>(sign | uint32_t(exp + 127 - 15) << 23 | mant << 13);
}

void SafetensorsReader::read_as_f32(const std::string& name,
                                    const std::vector<int64_t>& expected_shape, float* out) const {
  const TensorInfo& t = info(name);
  if (t.dtype == "F32") return read_f32(name, expected_shape, out);
  if (t.dtype != "F64" && t.dtype != "BF16" && t.dtype != "F16")
    usage_error("safetensors file '{}': tensor '{}' has dtype {} (need F32, BF16, F16 or F64)",
                path(), name, t.dtype);
  if (t.shape != expected_shape)
    usage_error("safetensors file '{}': tensor '{}' has shape {}, expected {}", path(), name,
                shape_string(t.shape), shape_string(expected_shape));
  const uint8_t* p = data_ + t.begin;
  const int64_t n = t.numel();
  if (t.dtype == "F64") {
    for (int64_t i = 0; i < n; ++i) {
      double v;
      std::memcpy(&v, p + 8 * i, 8);
      out[i] = static_cast<float>(v);
    }
    return;
  }
  const bool bf16 = t.dtype == "BF16";
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t v = uint16_t(p[2 * i] | p[2 * i + 1] << 8);  // little-endian
    out[i] = bf16 ? bf16_bits_to_f32(v) : f16_to_f32(v);
  }
}

const void* SafetensorsReader::raw(const std::string& name) const {
  return data_ + info(name).begin;
}

// ---------------------------------------------------------------------------------------------
// Writer

namespace {

// Checks a declaration; returns its size in bytes.
size_t declared_bytes(const TensorDecl& d) {
  TRAINER_CHECK(!d.name.empty() && d.name != "__metadata__", "bad tensor name '{}'", d.name);
  const size_t esize = safetensors_dtype_size(d.dtype);
  TRAINER_CHECK(esize > 0, "tensor '{}': unknown dtype '{}'", d.name, d.dtype);
  size_t numel = 1;
  for (int64_t n : d.shape) {
    TRAINER_CHECK(n >= 0, "tensor '{}': negative dimension in {}", d.name, shape_string(d.shape));
    numel *= static_cast<size_t>(n);
  }
  return numel * esize;
}

constexpr const char* kChecksumPlaceholder = "0000000000000000";  // hex64's width

}  // namespace

SafetensorsStream::SafetensorsStream(const std::string& path,
                                     const std::vector<TensorDecl>& tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), file_(path) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  for (const auto& [k, v] : metadata) {
    TRAINER_CHECK(k != kChecksumKey, "metadata key '{}' is reserved for the writer", k);
    meta[k] = v;
  }
  meta[kChecksumKey] = kChecksumPlaceholder;
  header["__metadata__"] = std::move(meta);
  for (const TensorDecl& d : tensors) {
    TRAINER_CHECK(!header.contains(d.name), "tensor '{}' added twice", d.name);
    const uint64_t bytes = declared_bytes(d);
    header[d.name] = {
        {"dtype", d.dtype}, {"shape", d.shape}, {"data_offsets", {total_, total_ + bytes}}};
    total_ += bytes;
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');  // pad so the data section starts 8-aligned
  // Where the placeholder sits: the reserved key appears once, with the placeholder as its value.
  const std::string key = fmt::format("\"{}\":\"", kChecksumKey);
  checksum_at_ = 8 + text.find(key) + key.size();
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t(text.size()) >> (8 * i));
  file_.append(len, 8);
  file_.append(text.data(), text.size());
  hash_ = Checksum64(total_);
}

void SafetensorsStream::append(const void* data, size_t bytes) {
  TRAINER_CHECK(written_ + bytes <= total_, "'{}': {} bytes past the declared tensors", path_,
                written_ + bytes - total_);
  TRAINER_CHECK(bytes == 0 || data != nullptr, "'{}': null data", path_);
  hash_.update(data, bytes);
  file_.append(data, bytes);
  written_ += bytes;
}

void SafetensorsStream::commit() {
  TRAINER_CHECK(written_ == total_, "'{}': {} of the declared {} bytes written", path_, written_,
                total_);
  const std::string hex = hex64(hash_.value());
  file_.overwrite(checksum_at_, hex.data(), hex.size());
  file_.commit();
}

void SafetensorsWriter::add(const std::string& name, const std::string& dtype,
                            std::vector<int64_t> shape, const void* data, size_t bytes) {
  TensorDecl d{name, dtype, std::move(shape)};
  const size_t want = declared_bytes(d);
  for (const TensorDecl& e : decls_) TRAINER_CHECK(e.name != name, "tensor '{}' added twice", name);
  TRAINER_CHECK(bytes == want, "tensor '{}': {} bytes for shape {} of {}", name, bytes,
                shape_string(d.shape), dtype);
  TRAINER_CHECK(bytes == 0 || data != nullptr, "tensor '{}': null data", name);
  decls_.push_back(std::move(d));
  data_.push_back({data, bytes});
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  TRAINER_CHECK(key != kChecksumKey, "metadata key '{}' is reserved for the writer", key);
  metadata_[key] = value;
}

void SafetensorsWriter::write(const std::string& path) const {
  SafetensorsStream s(path, decls_, metadata_);
  for (const ByteSpan& d : data_) s.append(d.data, d.size);
  s.commit();
}

}  // namespace trainer
