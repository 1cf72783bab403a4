#include "runtime/data.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <type_traits>

#include "core/error.h"
#include "core/mix64.h"

namespace trainer {

static_assert(std::endian::native == std::endian::little,
              "token files and safetensors are little-endian; this host is not");

// ---------------------------------------------------------------------------------------------
// MappedFile

MappedFile MappedFile::open(const std::string& path, const std::string& what) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (the check below refuses it).
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) usage_error("cannot open {} '{}': {}", what, path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    usage_error("cannot stat {} '{}': {}", what, path, std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                                              : "not a plain file";
    usage_error("{} '{}' is not a regular file ({})", what, path, kind);
  }
  MappedFile m;
  m.path_ = path;
  m.size_ = static_cast<size_t>(st.st_size);
  if (m.size_ > 0) {  // mmap of length 0 is an error; an empty file simply has no bytes
    void* p = ::mmap(nullptr, m.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      usage_error("cannot map {} '{}': {}", what, path, std::strerror(e));
    }
    m.bytes_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
  return m;
}

void MappedFile::release() {
  if (bytes_ != nullptr) ::munmap(const_cast<uint8_t*>(bytes_), size_);
  bytes_ = nullptr;
  size_ = 0;
}

MappedFile::~MappedFile() { release(); }

MappedFile::MappedFile(MappedFile&& o) noexcept
    : path_(std::move(o.path_)), bytes_(o.bytes_), size_(o.size_) {
  o.bytes_ = nullptr;
  o.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_);
    bytes_ = o.bytes_;
    size_ = o.size_;
    o.bytes_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

// ---------------------------------------------------------------------------------------------
// Atomic writes

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  tmp_ = fmt::format("{}.tmp.{}", path_, ::getpid());
  f_ = std::fopen(tmp_.c_str(), "wb");
  if (f_ == nullptr) {
    committed_ = true;  // nothing was created, nothing to remove
    fail("write");
  }
}

AtomicFile::~AtomicFile() {
  if (f_ != nullptr) std::fclose(f_);
  if (!committed_) std::remove(tmp_.c_str());
}

void AtomicFile::fail(const char* what) const {
  usage_error("cannot {} '{}': {}", what, path_, std::strerror(errno));
}

void AtomicFile::append(const void* data, size_t n) {
  TRAINER_CHECK(f_ != nullptr && !committed_, "append to '{}' after commit", path_);
  if (n > 0 && std::fwrite(data, 1, n, f_) != n) fail("write");
}

void AtomicFile::overwrite(uint64_t offset, const void* data, size_t n) {
  TRAINER_CHECK(f_ != nullptr && !committed_, "overwrite in '{}' after commit", path_);
  if (std::fflush(f_) != 0) fail("write");
  const auto* p = static_cast<const char*>(data);
  for (size_t done = 0; done < n;) {
    const ssize_t w = ::pwrite(::fileno(f_), p + done, n - done, static_cast<off_t>(offset + done));
    if (w <= 0) fail("write");
    done += static_cast<size_t>(w);
  }
}

void AtomicFile::commit() {
  TRAINER_CHECK(f_ != nullptr && !committed_, "'{}' committed twice", path_);
  if (std::fflush(f_) != 0 || ::fsync(::fileno(f_)) != 0) fail("write");
  const int rc = std::fclose(f_);
  f_ = nullptr;
  if (rc != 0) fail("write");
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0)
    usage_error("cannot rename '{}' to '{}': {}", tmp_, path_, std::strerror(errno));
  committed_ = true;
  // Make the rename itself durable: fsync the directory that holds the new entry.
  std::filesystem::path dir = std::filesystem::path(path_).parent_path();
  if (dir.empty()) dir = ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) usage_error("cannot open directory '{}': {}", dir.string(), std::strerror(errno));
  const int src = ::fsync(dfd);
  const int e = errno;
  ::close(dfd);
  if (src != 0) usage_error("cannot fsync directory '{}': {}", dir.string(), std::strerror(e));
}

void write_file_atomic(const std::string& path, const std::vector<ByteSpan>& pieces) {
  AtomicFile f(path);
  for (const ByteSpan& p : pieces) f.append(p.data, p.size);
  f.commit();
}

// ---------------------------------------------------------------------------------------------
// .npy header: a Python dict literal such as
//   {'descr': '<u2', 'fortran_order': False, 'shape': (1000,), }

namespace {

struct PyValue {
  enum Kind { kStr, kBool, kInt, kTuple, kNone } kind = kNone;
  std::string raw;  // source text, for error messages
  std::string str;
  bool boolean = false;
  int64_t integer = 0;
  std::vector<PyValue> items;
};

class PyLiteralParser {
 public:
  PyLiteralParser(std::string_view text, const std::string& path) : s_(text), path_(path) {}

  std::vector<std::pair<std::string, PyValue>> dict() {
    std::vector<std::pair<std::string, PyValue>> out;
    skip();
    expect('{');
    for (;;) {
      skip();
      if (peek() == '}') break;
      PyValue key = value();
      if (key.kind != PyValue::kStr) fail("dict key is not a string");
      skip();
      expect(':');
      out.emplace_back(key.str, value());
      skip();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      skip();
      if (peek() != '}') fail("expected ',' or '}'");
    }
    ++i_;
    return out;
  }

 private:
  [[noreturn]] void fail(const char* why) {
    usage_error("token file '{}': cannot parse the .npy header ({} at column {}): {}", path_, why,
                i_, std::string(s_));
  }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void skip() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  void expect(char c) {
    if (peek() != c) fail("unexpected character");
    ++i_;
  }
  bool word(std::string_view w) {
    if (s_.substr(i_, w.size()) != w) return false;
    i_ += w.size();
    return true;
  }

  PyValue value() {
    skip();
    size_t start = i_;
    PyValue v;
    char c = peek();
    if (c == '\'' || c == '"') {
      ++i_;
      v.kind = PyValue::kStr;
      while (i_ < s_.size() && s_[i_] != c) {
        if (s_[i_] == '\\' && i_ + 1 < s_.size()) ++i_;
        v.str += s_[i_++];
      }
      expect(c);
    } else if (c == '(' || c == '[') {
      char close = c == '(' ? ')' : ']';
      ++i_;
      v.kind = PyValue::kTuple;
      for (;;) {
        skip();
        if (peek() == close) break;
        v.items.push_back(value());
        skip();
        if (peek() == ',')
          ++i_;
        else if (peek() != close)
          fail("expected ',' or a closing bracket");
      }
      ++i_;
    } else if (std::isdigit(static_cast<unsigned char>(c)) || c == '-') {
      v.kind = PyValue::kInt;
      size_t j = i_ + (c == '-' ? 1 : 0);
      if (j >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[j]))) fail("bad number");
      while (j < s_.size() && std::isdigit(static_cast<unsigned char>(s_[j]))) ++j;
      while (j < s_.size() && s_[j] == 'L') ++j;  // Python 2 longs
      std::string digits(s_.substr(i_, j - i_));
      errno = 0;
      v.integer = std::strtoll(digits.c_str(), nullptr, 10);
      if (errno == ERANGE) fail("number out of range");
      i_ = j;
    } else if (word("True")) {
      v.kind = PyValue::kBool;
      v.boolean = true;
    } else if (word("False")) {
      v.kind = PyValue::kBool;
    } else if (word("None")) {
      v.kind = PyValue::kNone;
    } else {
      fail("unexpected value");
    }
    v.raw = std::string(s_.substr(start, i_ - start));
    return v;
  }

  std::string_view s_;
  const std::string& path_;
  size_t i_ = 0;
};

uint32_t load_le32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

bool has_npy_extension(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".npy";
}

std::string shape_text(const std::vector<PyValue>& dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) s += ", ";
    s += dims[i].raw;
  }
  return s + (dims.size() == 1 ? ",)" : ")");
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// TokenFile

constexpr uint32_t kLlmcMagic = 20240520;
constexpr size_t kLlmcHeaderBytes = 256 * 4;

TokenFile TokenFile::open(const std::string& path) {
  TokenFile t;
  t.file_ = MappedFile::open(path, "token file");
  const uint8_t* b = t.file_.bytes();
  const size_t size = t.file_.size();

  static constexpr char kMagic[] = "\x93NUMPY";
  if (!has_npy_extension(path)) {
    // A .npy under another name would train on its header bytes.
    if (size >= 6 && std::memcmp(b, kMagic, 6) == 0)
      usage_error("token file '{}' starts with the .npy magic (\\x93NUMPY): name it .npy", path);
    // llm.c's token shards (dev/data/*.bin) start with 256 int32: magic, version, token count.
    // Version 1 holds uint16 GPT-2 tokens; version 2 holds uint32 (LLaMA 3) tokens.
    if (size >= kLlmcHeaderBytes && load_le32(b) == kLlmcMagic) {
      const uint32_t version = load_le32(b + 4), count = load_le32(b + 8);
      if (version != 1)
        usage_error(
            "token file '{}' is an llm.c shard of version {}; only version 1 (uint16 tokens) is "
            "read",
            path, version);
      if (size != kLlmcHeaderBytes + 2 * size_t{count})
        usage_error(
            "token file '{}': its llm.c header says {} tokens ({} bytes with the header) but the "
            "file has {} bytes",
            path, count, kLlmcHeaderBytes + 2 * size_t{count}, size);
      t.tokens_ = b + kLlmcHeaderBytes;
      t.n_ = count;
      return t;
    }
    if (size % 2 != 0)
      usage_error("token file '{}' has an odd size ({} bytes); a raw .bin holds uint16 tokens",
                  path, size);
    t.tokens_ = b;  // mmap is page-aligned
    t.n_ = static_cast<int64_t>(size / 2);
    return t;
  }

  if (size < 6 || std::memcmp(b, kMagic, 6) != 0)
    usage_error("token file '{}' is not a .npy file (bad magic; expected \\x93NUMPY)", path);
  if (size < 10) usage_error("token file '{}' is truncated inside the .npy preamble", path);
  const int major = b[6], minor = b[7];
  size_t header_begin = 0, header_len = 0;
  if (major == 1) {
    header_begin = 10;
    header_len = size_t(b[8]) | size_t(b[9]) << 8;
  } else if (major == 2 || major == 3) {
    if (size < 12) usage_error("token file '{}' is truncated inside the .npy preamble", path);
    header_begin = 12;
    header_len = load_le32(b + 8);
  } else {
    usage_error("token file '{}' has unsupported .npy version {}.{} (need 1.0, 2.0 or 3.0)", path,
                major, minor);
  }
  if (header_begin + header_len > size)
    usage_error("token file '{}' is truncated: the .npy header needs {} bytes but the file has {}",
                path, header_begin + header_len, size);

  std::string_view header(reinterpret_cast<const char*>(b + header_begin), header_len);
  std::optional<PyValue> descr, fortran, shape;
  for (auto& [key, v] : PyLiteralParser(header, path).dict()) {
    if (key == "descr") descr = v;
    if (key == "fortran_order") fortran = v;
    if (key == "shape") shape = v;
  }
  if (!descr || !fortran || !shape)
    usage_error("token file '{}': the .npy header lacks '{}'", path,
                !descr     ? "descr"
                : !fortran ? "fortran_order"
                           : "shape");
  if (descr->kind != PyValue::kStr || (descr->str != "<u2" && descr->str != "<u4"))
    usage_error("token file '{}' has dtype {} (need '<u2' = uint16 or '<u4' = uint32)", path,
                descr->raw);
  t.dtype_ = descr->str == "<u2" ? TokenDtype::kU16 : TokenDtype::kU32;
  const size_t width = t.dtype_ == TokenDtype::kU16 ? 2 : 4;
  if (fortran->kind != PyValue::kBool)
    usage_error("token file '{}': fortran_order is {} (need False)", path, fortran->raw);
  if (fortran->boolean) usage_error("token file '{}' is in Fortran order (need C order)", path);
  if (shape->kind != PyValue::kTuple)
    usage_error("token file '{}': shape is {} (need a tuple)", path, shape->raw);
  if (shape->items.size() != 1)
    usage_error("token file '{}' has a {}-D shape {} (need 1-D)", path, shape->items.size(),
                shape_text(shape->items));
  const PyValue& dim = shape->items[0];
  if (dim.kind != PyValue::kInt || dim.integer < 0)
    usage_error("token file '{}' has shape {} (need a non-negative length)", path,
                shape_text(shape->items));

  // The mapping is page-aligned, so an aligned offset gives aligned ids (NumPy pads to 64).
  const size_t data_begin = header_begin + header_len;
  if (data_begin % width != 0)
    usage_error("token file '{}': the .npy header ends at byte {}, misaligning the {} data", path,
                data_begin, dtype_name(t.dtype_));
  const size_t follow = size - data_begin;
  const uint64_t n = static_cast<uint64_t>(dim.integer);
  if (n > follow / width)
    usage_error("token file '{}' is truncated: header says {} tokens but {} bytes follow", path, n,
                follow);
  if (follow != width * n)
    usage_error(
        "token file '{}' has {} bytes after its data (header says {} tokens, {} bytes follow)",
        path, follow - width * n, n, follow);
  t.tokens_ = b + data_begin;
  t.n_ = static_cast<int64_t>(n);
  return t;
}

const char* dtype_name(TokenDtype dtype) { return dtype == TokenDtype::kU16 ? "uint16" : "uint32"; }

namespace {

// Every id of d[0, n) below vocab, or a UsageError naming the first one that is not.
template <typename T>
void check_ids(const T* d, int64_t n, int64_t vocab, const std::string& path) {
  if (vocab > int64_t{std::numeric_limits<T>::max()}) return;  // every T fits
  // A max-reduction vectorises; only a failing file pays for the second, sequential scan. uint16
  // ids reduce in int, as they always have; uint32 ones in their own type.
  using Max = std::conditional_t<sizeof(T) == 2, int, uint32_t>;
  Max max_id = 0;
#pragma omp parallel for reduction(max : max_id) schedule(static)
  for (int64_t i = 0; i < n; ++i) max_id = std::max<Max>(max_id, d[i]);
  if (int64_t{max_id} < vocab) return;
  for (int64_t i = 0; i < n; ++i)
    if (int64_t{d[i]} >= vocab)
      usage_error("token file '{}' has token id {} at position {}, outside the vocabulary of {}",
                  path, d[i], i, vocab);
}

}  // namespace

void TokenFile::check_vocab(int64_t vocab) const {
  TRAINER_CHECK(vocab > 0, "vocab {} must be positive", vocab);
  if (dtype_ == TokenDtype::kU16)
    check_ids(u16(), n_, vocab, path());
  else
    check_ids(u32(), n_, vocab, path());
}

std::optional<int64_t> recorded_vocab_size(const std::string& token_path) {
  std::filesystem::path dir = std::filesystem::path(token_path).parent_path();
  const std::filesystem::path meta = (dir.empty() ? "." : dir) / "meta.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(meta, ec)) return std::nullopt;
  std::ifstream in(meta, std::ios::binary);
  const std::string text{std::istreambuf_iterator<char>(in), {}};
  // allow_exceptions = false: a meta.json that is not JSON is someone else's, not an error.
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object()) return std::nullopt;
  const auto v = j.find("vocab_size");
  if (v == j.end() || !v->is_number_integer()) return std::nullopt;
  return v->get<int64_t>();
}

void TokenFile::check_length(int64_t ctx) const {
  TRAINER_CHECK(ctx > 0, "context length {} must be positive", ctx);
  if (n_ < ctx + 2)
    usage_error(
        "token file '{}' is too short: {} tokens, but context length {} needs at least {} "
        "(offsets are drawn from [0, N - ctx - 1))",
        path(), n_, ctx, ctx + 2);
}

namespace {

void write_npy(const std::string& path, const char* descr, const void* data, size_t width,
               int64_t n) {
  TRAINER_CHECK(n >= 0 && (n == 0 || data != nullptr), "bad token array ({} tokens)", n);
  std::string dict =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({},), }}", descr, n);
  // Preamble (10 bytes) + dict + spaces + '\n' is a multiple of 64, as NumPy writes it.
  size_t total = (10 + dict.size() + 1 + 63) / 64 * 64;
  std::string header(total, ' ');
  std::memcpy(header.data(), "\x93NUMPY\x01\x00", 8);
  const size_t hlen = total - 10;
  TRAINER_CHECK(hlen <= 65535, "npy header of {} bytes does not fit version 1.0", hlen);
  header[8] = static_cast<char>(hlen & 0xff);
  header[9] = static_cast<char>(hlen >> 8);
  std::memcpy(header.data() + 10, dict.data(), dict.size());
  header.back() = '\n';
  write_file_atomic(path, {{header.data(), header.size()}, {data, static_cast<size_t>(n) * width}});
}

}  // namespace

void write_npy_u16(const std::string& path, const uint16_t* data, int64_t n) {
  write_npy(path, "<u2", data, sizeof(uint16_t), n);
}

void write_npy_u32(const std::string& path, const uint32_t* data, int64_t n) {
  write_npy(path, "<u4", data, sizeof(uint32_t), n);
}

void write_token_file(const std::string& path, const uint16_t* data, int64_t n) {
  if (has_npy_extension(path)) return write_npy_u16(path, data, n);
  TRAINER_CHECK(n >= 0 && (n == 0 || data != nullptr), "bad token array ({} tokens)", n);
  write_file_atomic(path, {{data, static_cast<size_t>(n) * sizeof(uint16_t)}});
}

// ---------------------------------------------------------------------------------------------
// Samplers

SamplerKind parse_sampler(const std::string& name) {
  if (name == "sequential") return SamplerKind::kSequential;
  if (name == "random") return SamplerKind::kRandom;
  usage_error("--sampler '{}': expected 'sequential' or 'random'", name);
}

const char* sampler_name(SamplerKind kind) {
  return kind == SamplerKind::kSequential ? "sequential" : "random";
}

// Random: h = mix(mix(mix(seed + g) + (s+1) g) + (r+1) g), g the golden-ratio constant. Each
// stage is a bijection of its counter for a fixed prefix, so distinct rows of a step (and distinct
// steps for a seed) get distinct 64-bit hashes; o = floor(h * M / 2^64) maps them onto [0, M)
// with bias at most M / 2^64.
int64_t Sampler::offset(int64_t step, int64_t row) const {
  const int64_t m = n_tokens - ctx - 1;  // offsets in [0, m)
  TRAINER_CHECK(m >= 1 && ctx > 0, "{} tokens are too few for context {}", n_tokens, ctx);
  TRAINER_CHECK(step >= 0 && row >= 0 && row < global_rows, "row {} of step {} outside [0, {})",
                row, step, global_rows);
  if (kind == SamplerKind::kSequential) {
    // ((s*G + r) * T) mod m, exact in 128 bits.
    unsigned __int128 idx =
        static_cast<unsigned __int128>(step) * uint64_t(global_rows) + static_cast<uint64_t>(row);
    return static_cast<int64_t>((idx * static_cast<uint64_t>(ctx)) % static_cast<uint64_t>(m));
  }
  uint64_t h = mix64(seed + kGolden);
  h = mix64(h + (static_cast<uint64_t>(step) + 1) * kGolden);
  h = mix64(h + (static_cast<uint64_t>(row) + 1) * kGolden);
  return static_cast<int64_t>((static_cast<unsigned __int128>(h) * static_cast<uint64_t>(m)) >> 64);
}

TokenStream TokenStream::open(const std::string& spec) {
  TokenStream t;
  t.spec_ = spec;
  size_t begin = 0;
  while (begin <= spec.size()) {
    const size_t comma = std::min(spec.find(',', begin), spec.size());
    const std::string item = spec.substr(begin, comma - begin);
    begin = comma + 1;
    if (item.empty()) usage_error("--data '{}': an empty file name in the list", spec);
    std::vector<std::string> paths{item};
    if (item.find_first_of("*?[") != std::string::npos) {
      glob_t g{};
      const int rc = ::glob(item.c_str(), 0, nullptr, &g);  // matches sorted by name
      paths.assign(g.gl_pathv, g.gl_pathv + (rc == 0 ? g.gl_pathc : 0));
      globfree(&g);
      if (paths.empty()) usage_error("--data '{}': the pattern '{}' matches no file", spec, item);
    }
    for (const std::string& p : paths) {
      t.files_.push_back(TokenFile::open(p));
      t.starts_.push_back(t.starts_.back() + t.files_.back().size());
    }
  }
  return t;
}

void TokenStream::check_vocab(int64_t vocab) const {
  // The tokenizer's vocabulary first: a smaller --vocab is wrong even where the ids in these
  // files happen to fit (the model could never predict the others). One look per directory.
  std::set<std::filesystem::path> seen;
  for (const TokenFile& f : files_) {
    const std::filesystem::path dir = std::filesystem::path(f.path()).parent_path();
    if (!seen.insert(dir).second) continue;
    const std::optional<int64_t> recorded = recorded_vocab_size(f.path());
    if (recorded && vocab < *recorded)
      usage_error(
          "--vocab {} is smaller than the vocabulary of the tokenizer that made token file '{}': "
          "{} tokens (from '{}'); pass --vocab {} or more",
          vocab, f.path(), *recorded, ((dir.empty() ? "." : dir) / "meta.json").string(),
          *recorded);
  }
  for (const TokenFile& f : files_) f.check_vocab(vocab);
}

void TokenStream::check_length(int64_t ctx) const {
  if (files_.size() == 1) return files_[0].check_length(ctx);
  TRAINER_CHECK(ctx > 0, "context length {} must be positive", ctx);
  if (size() < ctx + 2)
    usage_error(
        "token files '{}' are too short: {} tokens in all, but context length {} needs at "
        "least {}",
        spec_, size(), ctx, ctx + 2);
}

void TokenStream::read(int64_t offset, int64_t n, int32_t* out) const {
  TRAINER_CHECK(offset >= 0 && n >= 0 && offset + n <= size(), "tokens [{}, {}) outside [0, {})",
                offset, offset + n, size());
  // The file holding `offset`, then on across file boundaries.
  size_t f = std::upper_bound(starts_.begin(), starts_.end(), offset) - starts_.begin() - 1;
  while (n > 0) {
    const TokenFile& file = files_[f];
    const int64_t local = offset - starts_[f];
    const int64_t take = std::min(n, file.size() - local);
    if (file.dtype() == TokenDtype::kU16) {
      const uint16_t* tok = file.u16() + local;
      for (int64_t i = 0; i < take; ++i) out[i] = tok[i];
    } else {
      // Ids past INT32_MAX would wrap; check_vocab has refused them (vocab < 2^30).
      const uint32_t* tok = file.u32() + local;
      for (int64_t i = 0; i < take; ++i) out[i] = static_cast<int32_t>(tok[i]);
    }
    out += take, offset += take, n -= take, ++f;
  }
}

void fill_rows(const TokenStream& f, const Sampler& s, int64_t step, int64_t row_begin,
               int64_t n_rows, int32_t* inputs, int32_t* targets) {
  TRAINER_CHECK(f.size() == s.n_tokens, "sampler built for {} tokens, '{}' has {}", s.n_tokens,
                f.spec(), f.size());
  TRAINER_CHECK(row_begin >= 0 && n_rows >= 0 && row_begin + n_rows <= s.global_rows,
                "rows [{}, {}) outside [0, {})", row_begin, row_begin + n_rows, s.global_rows);
  const int64_t T = s.ctx;
  std::vector<int32_t> window(T + 1);
  for (int64_t i = 0; i < n_rows; ++i) {
    f.read(s.offset(step, row_begin + i), T + 1, window.data());  // o + T + 1 <= N - 1 < N
    std::copy(window.begin(), window.end() - 1, inputs + i * T);
    std::copy(window.begin() + 1, window.end(), targets + i * T);
  }
}

}  // namespace trainer
