#include "runtime/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"

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

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

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

uint64_t combine(const std::vector<uint64_t>& chunks, uint64_t total) {
  uint64_t h = mix64(0x7472616e6572ULL ^ total);
  for (uint64_t c : chunks) h = mix64(h ^ c) + kP1;
  return mix64(h);
}

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }

}  // namespace

uint64_t checksum64(const void* data, size_t n) { return checksum64({{data, n}}); }

uint64_t checksum64(const std::vector<ByteSpan>& pieces) {
  // starts[k] is the offset of piece k in the concatenation.
  std::vector<uint64_t> starts(pieces.size() + 1, 0);
  for (size_t k = 0; k < pieces.size(); ++k) starts[k + 1] = starts[k] + pieces[k].size;
  const uint64_t total = starts.back();
  const int64_t n_chunks = static_cast<int64_t>((total + kChunk - 1) / kChunk);
  std::vector<uint64_t> hashes(n_chunks);
#pragma omp parallel
  {
    std::vector<uint8_t> scratch;  // for the few chunks that straddle two pieces
#pragma omp for schedule(static)
    for (int64_t c = 0; c < n_chunks; ++c) {
      const uint64_t b = uint64_t(c) * kChunk, e = std::min<uint64_t>(b + kChunk, total);
      // Piece holding byte b: starts[k] <= b < starts[k + 1] (so it is not empty).
      size_t k = std::upper_bound(starts.begin(), starts.end(), b) - starts.begin() - 1;
      const uint8_t* base = static_cast<const uint8_t*>(pieces[k].data);
      if (e <= starts[k + 1]) {
        hashes[c] = chunk_hash(base + (b - starts[k]), e - b);
        continue;
      }
      scratch.resize(e - b);
      for (uint64_t at = b; at < e; ++k) {
        const uint64_t lo = std::max(at, starts[k]), hi = std::min(e, starts[k + 1]);
        if (hi <= lo) continue;
        std::memcpy(scratch.data() + (lo - b),
                    static_cast<const uint8_t*>(pieces[k].data) + (lo - starts[k]), hi - lo);
        at = hi;
      }
      hashes[c] = chunk_hash(scratch.data(), e - b);
    }
  }
  return combine(hashes, total);
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
                                 const std::vector<int64_t>& expected_shape, float* out) const {
  const TensorInfo& t = info(name);
  if (t.dtype != "F32")
    usage_error("safetensors file '{}': tensor '{}' has dtype {} (need F32)", path(), name,
                t.dtype);
  if (t.shape != expected_shape)
    usage_error("safetensors file '{}': tensor '{}' has shape {}, expected {}", path(), name,
                shape_string(t.shape), shape_string(expected_shape));
  if (t.end > t.begin) std::memcpy(out, data_ + t.begin, t.end - t.begin);
}

const void* SafetensorsReader::raw(const std::string& name) const {
  return data_ + info(name).begin;
}

// ---------------------------------------------------------------------------------------------
// Writer

void SafetensorsWriter::add(const std::string& name, const std::string& dtype,
                            std::vector<int64_t> shape, const void* data, size_t bytes) {
  TRAINER_CHECK(!name.empty() && name != "__metadata__", "bad tensor name '{}'", name);
  for (const Entry& e : entries_) TRAINER_CHECK(e.name != name, "tensor '{}' added twice", name);
  const size_t esize = safetensors_dtype_size(dtype);
  TRAINER_CHECK(esize > 0, "tensor '{}': unknown dtype '{}'", name, dtype);
  size_t numel = 1;
  for (int64_t d : shape) {
    TRAINER_CHECK(d >= 0, "tensor '{}': negative dimension in {}", name, shape_string(shape));
    numel *= static_cast<size_t>(d);
  }
  TRAINER_CHECK(bytes == numel * esize, "tensor '{}': {} bytes for shape {} of {}", name, bytes,
                shape_string(shape), dtype);
  TRAINER_CHECK(bytes == 0 || data != nullptr, "tensor '{}': null data", name);
  entries_.push_back({name, dtype, std::move(shape), data, bytes});
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  TRAINER_CHECK(key != kChecksumKey, "metadata key '{}' is reserved for the writer", key);
  metadata_[key] = value;
}

void SafetensorsWriter::write(const std::string& path) const {
  std::vector<ByteSpan> data;
  for (const Entry& e : entries_) data.push_back({e.data, e.bytes});

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  for (const auto& [k, v] : metadata_) meta[k] = v;
  meta[kChecksumKey] = hex64(checksum64(data));
  header["__metadata__"] = std::move(meta);
  uint64_t at = 0;
  for (const Entry& e : entries_) {
    header[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {at, at + e.bytes}}};
    at += e.bytes;
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');  // pad so the data section starts 8-aligned

  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t(text.size()) >> (8 * i));
  std::vector<ByteSpan> pieces = {{len, 8}, {text.data(), text.size()}};
  pieces.insert(pieces.end(), data.begin(), data.end());
  write_file_atomic(path, pieces);
}

}  // namespace trainer
