// Reading and writing safetensors files (https://huggingface.co/docs/safetensors).
//
// Layout: 8-byte little-endian header length N; N bytes of JSON
//   {"__metadata__": {str: str}, name: {"dtype": "F32", "shape": [...], "data_offsets": [b, e]}}
// padded with spaces to a multiple of 8; then the data section, tensors back to back with offsets
// relative to its start. Our writer adds the metadata key "trainer.checksum" (a 64-bit hash of the
// data section, 16 hex digits) and the reader verifies it when present, so a torn or bit-flipped
// checkpoint is refused instead of silently loaded. Files from other writers (no checksum) load
// too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/data.h"

namespace trainer {

inline constexpr const char* kChecksumKey = "trainer.checksum";

// Bytes per element of a safetensors dtype ("F32", "BF16", "I64", ...); 0 if unknown.
size_t safetensors_dtype_size(const std::string& dtype);

// The data-section checksum: 1 MiB chunks hashed in parallel (4-lane multiply-rotate rounds),
// chained in order, so the value does not depend on the thread count. Not cryptographic: it is
// there to catch torn writes and flipped bits.
uint64_t checksum64(const void* data, size_t n);
// The same value over the concatenation of `pieces`, without concatenating them.
uint64_t checksum64(const std::vector<ByteSpan>& pieces);

// checksum64 fed in order, in pieces of any size: the total length must be known up front (it
// seeds the hash). Full 1 MiB chunks are hashed as they arrive (in parallel within a piece).
class Checksum64 {
 public:
  explicit Checksum64(uint64_t total);
  void update(const void* data, size_t n);
  // After exactly `total` bytes.
  uint64_t value();

 private:
  void add_chunks(const uint8_t* p, size_t n);  // whole chunks, or the final short one
  uint64_t total_, seen_ = 0, h_;
  std::vector<uint8_t> carry_;  // a started chunk
};

struct TensorInfo {
  std::string name, dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data section
  int64_t numel() const;
};

class SafetensorsReader {
 public:
  // Maps the file and validates it completely (see safetensors.cpp); any defect throws UsageError
  // naming the file and, where one is at fault, the tensor.
  static SafetensorsReader open(const std::string& path);

  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // Throws UsageError naming the file and the tensor if there is no such tensor.
  const TensorInfo& info(const std::string& name) const;
  // Tensor names in data-section order.
  std::vector<std::string> names() const { return order_; }
  // Copies an F32 tensor of exactly `expected_shape` into out[numel]; a different dtype or shape
  // throws UsageError naming the file, the tensor, the expected and the found shape. With
  // `count` >= 0, copies only elements [first, first + count) (the checks are the same).
  void read_f32(const std::string& name, const std::vector<int64_t>& expected_shape, float* out,
                int64_t first = 0, int64_t count = -1) const;
  // Like read_f32 (the whole tensor) for any floating-point dtype: F32, F64, BF16 and F16
  // are converted to fp32 (F64 rounded to nearest; the 16-bit types exactly); any other
  // dtype throws UsageError naming the file, the tensor and the dtype.
  void read_as_f32(const std::string& name, const std::vector<int64_t>& expected_shape,
                   float* out) const;
  // The tensor's bytes inside the mapping (valid while the reader lives). Alignment is whatever
  // the writer chose: copy with memcpy rather than casting for foreign files.
  const void* raw(const std::string& name) const;
  const std::string& path() const { return file_.path(); }

 private:
  SafetensorsReader() = default;
  MappedFile file_;
  const uint8_t* data_ = nullptr;  // start of the data section
  uint64_t data_size_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::vector<std::string> order_;
  std::map<std::string, std::string> metadata_;
};

// A tensor as the header declares it.
struct TensorDecl {
  std::string name, dtype;
  std::vector<int64_t> shape;
};

// A safetensors file written tensor by tensor, without holding the tensors in memory: the header
// goes first with a placeholder for "trainer.checksum" of the same width, then the data section;
// commit() writes the real checksum into the header and moves the file into place atomically
// (an AtomicFile: destroyed before commit(), nothing appears at `path`).
class SafetensorsStream {
 public:
  // Validates the declarations (names unique and not "__metadata__", known dtypes, dimensions
  // >= 0; a RuntimeError otherwise) and writes the header.
  SafetensorsStream(const std::string& path, const std::vector<TensorDecl>& tensors,
                    const std::map<std::string, std::string>& metadata);
  // The next bytes of the data section: the tensors back to back in declaration order, in
  // pieces of any size.
  void append(const void* data, size_t bytes);
  // After exactly the declared bytes.
  void commit();

 private:
  std::string path_;
  AtomicFile file_;
  uint64_t total_ = 0, written_ = 0, checksum_at_ = 0;
  Checksum64 hash_{0};
};

class SafetensorsWriter {
 public:
  // `data` (bytes long, = numel * dtype size) must stay alive until write(). Tensors are written
  // in the order added.
  void add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
           const void* data, size_t bytes);
  void set_metadata(const std::string& key, const std::string& value);
  // Atomic (temp file, fsync, rename, fsync dir); adds "trainer.checksum". I/O errors throw
  // UsageError naming the path and strerror. (A SafetensorsStream of the added tensors.)
  void write(const std::string& path) const;

 private:
  std::vector<TensorDecl> decls_;
  std::vector<ByteSpan> data_;
  std::map<std::string, std::string> metadata_;
};

// IEEE binary16 bit pattern to fp32 (exact: every binary16 value is an fp32). bfloat16's is
// bf16_bits_to_f32 in core/bf16.h.
float f16_to_f32(uint16_t h);

// Formats a shape as "[3, 4]" for messages.
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace trainer
