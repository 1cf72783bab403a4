// Token data: memory-mapped token files, the batch samplers of SPEC.md, and the small file
// helpers (read-only maps, atomic writes) that checkpoints share.
//
// A token file is a flat array of token ids: a NumPy `.npy` (1-D, C order) of dtype '<u2'
// (uint16) or '<u4' (uint32, for vocabularies past 65536), or a raw little-endian uint16 `.bin`
// (a raw file says nothing of its width, so uint32 ids need .npy). Row r of step s starts at token
// offset o(s, r); its input is tokens[o : o+T] and its target tokens[o+1 : o+T+1]. Offsets depend
// only on (seed, s, r) and the file, never on the world size, so a run resumed on a different
// number of ranks sees the same batches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace trainer {

// ---- file helpers ----

// A whole file mapped read-only. Errors (missing, unreadable, not a regular file) throw
// UsageError naming `what` ("token file", "checkpoint"), the path and strerror.
class MappedFile {
 public:
  MappedFile() = default;
  static MappedFile open(const std::string& path, const std::string& what);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* bytes() const { return bytes_; }  // nullptr for an empty file
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void release();
  std::string path_;
  const uint8_t* bytes_ = nullptr;
  size_t size_ = 0;
};

// One contiguous piece of a file being written.
struct ByteSpan {
  const void* data = nullptr;
  size_t size = 0;
};

// A file written in pieces that appears at `path` only when complete: the bytes go to
// `path.tmp.<pid>`; commit() fflushes, fsyncs, renames it over `path` and fsyncs the directory, so
// a reader sees the old file or the whole new one, never a torn one. Destroyed uncommitted (an
// error on the way), the temp file is removed. I/O errors throw UsageError naming the path and
// strerror.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void append(const void* data, size_t n);
  // Overwrites bytes already appended, at `offset` from the start of the file.
  void overwrite(uint64_t offset, const void* data, size_t n);
  void commit();

 private:
  [[noreturn]] void fail(const char* what) const;
  std::string path_, tmp_;
  FILE* f_ = nullptr;
  bool committed_ = false;
};

// Writes the concatenation of `pieces` to `path` atomically (an AtomicFile).
void write_file_atomic(const std::string& path, const std::vector<ByteSpan>& pieces);

// ---- token files ----

// The width of the ids in a token file.
enum class TokenDtype { kU16, kU32 };
const char* dtype_name(TokenDtype dtype);  // "uint16", "uint32"

class TokenFile {
 public:
  // `.npy` (any case) is parsed as NumPy ('<u2' or '<u4'); every other extension is raw
  // little-endian uint16, or an llm.c token shard (a 1 KiB header: int32 magic 20240520,
  // version 1, token count; then uint16).
  static TokenFile open(const std::string& path);

  TokenFile(TokenFile&&) noexcept = default;
  TokenFile& operator=(TokenFile&&) noexcept = default;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  int64_t size() const { return n_; }
  TokenDtype dtype() const { return dtype_; }
  // The ids, in place in the mapping: u16() of a uint16 file, u32() of a uint32 one; the other
  // width gives nullptr.
  const uint16_t* u16() const {
    return dtype_ == TokenDtype::kU16 ? static_cast<const uint16_t*>(tokens_) : nullptr;
  }
  const uint32_t* u32() const {
    return dtype_ == TokenDtype::kU32 ? static_cast<const uint32_t*>(tokens_) : nullptr;
  }
  const std::string& path() const { return file_.path(); }

  // Throws UsageError naming the file, the first position and the id if any id >= vocab.
  void check_vocab(int64_t vocab) const;
  // Offsets are drawn from [0, N - ctx - 1), so a file needs at least ctx + 2 tokens.
  void check_length(int64_t ctx) const;

 private:
  TokenFile() = default;
  MappedFile file_;
  const void* tokens_ = nullptr;
  TokenDtype dtype_ = TokenDtype::kU16;
  int64_t n_ = 0;
};

// The vocabulary size recorded for a token file by launch/prepare_text.py: the integer
// "vocab_size" of a `meta.json` in the file's directory (the largest id its tokenizer can give,
// plus one). nullopt where there is no meta.json, or one that is not a JSON object with an
// integer "vocab_size" (someone else's file).
std::optional<int64_t> recorded_vocab_size(const std::string& token_path);

// The training (or validation) tokens: one file, or several read as their concatenation in the
// order given -- llm.c's shards, say. `spec` is a path, a comma-separated list of paths, or a glob
// pattern (its matches in name order), or a list of those. SPEC.md's N is the total.
class TokenStream {
 public:
  static TokenStream open(const std::string& spec);

  int64_t size() const { return starts_.back(); }
  const std::string& spec() const { return spec_; }
  const std::vector<TokenFile>& files() const { return files_; }
  // vocab is at least the tokenizer's vocabulary where a file has one recorded beside it
  // (recorded_vocab_size; the message names both sizes and the meta.json), and every file's
  // ids < vocab (the message names the file and position).
  void check_vocab(int64_t vocab) const;
  // Enough tokens for ctx.
  void check_length(int64_t ctx) const;
  // Tokens [offset, offset + n) of the concatenation, as int32, into out[n].
  void read(int64_t offset, int64_t n, int32_t* out) const;

 private:
  std::string spec_;
  std::vector<TokenFile> files_;
  std::vector<int64_t> starts_{0};  // where each file begins in the concatenation; then the total
};

// Writes a NumPy 1.0 `.npy` of dtype '<u2' / '<u4' (header padded: the data starts at byte 64*k).
void write_npy_u16(const std::string& path, const uint16_t* data, int64_t n);
void write_npy_u32(const std::string& path, const uint32_t* data, int64_t n);
// The inverse of TokenFile::open: `.npy` by extension, raw little-endian `.bin` otherwise.
void write_token_file(const std::string& path, const uint16_t* data, int64_t n);

// ---- samplers ----

enum class SamplerKind { kSequential, kRandom };
// "sequential" or "random"; anything else throws UsageError naming --sampler.
SamplerKind parse_sampler(const std::string& name);
const char* sampler_name(SamplerKind kind);

// Where row `row` (0 <= row < global_rows) of step `step` starts, exactly as SPEC.md says.
struct Sampler {
  SamplerKind kind = SamplerKind::kRandom;
  uint64_t seed = 0;
  int64_t n_tokens = 0;     // N
  int64_t ctx = 0;          // T
  int64_t global_rows = 0;  // G = batch * world * grad_accum

  // sequential: ((s*G + r) * T) mod (N - T - 1); random: hash(seed, s, r) mapped onto
  // [0, N - T - 1) by a multiply-high (Lemire) reduction.
  int64_t offset(int64_t step, int64_t row) const;
};

// Rows row_begin .. row_begin + n_rows - 1 of `step`, ctx tokens each, row-major into
// inputs[n_rows * ctx] and targets[n_rows * ctx].
void fill_rows(const TokenStream& f, const Sampler& s, int64_t step, int64_t row_begin,
               int64_t n_rows, int32_t* inputs, int32_t* targets);

}  // namespace trainer
