// safetensors: bit-exact round trips, a hand-built reference file, and every corruption we refuse.
#include <omp.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/safetensors.h"
#include "tests/catch.h"
#include "tests/scratch_files.h"

using namespace trainer;

namespace {

uint64_t header_len(const std::string& file) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<uint8_t>(file[i]);
  return n;
}

// A safetensors file by hand, as another writer would make it: length, JSON, spaces, data.
std::string make_st(std::string json, const std::string& data) {
  json.resize((json.size() + 7) / 8 * 8, ' ');
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(uint64_t(json.size()) >> (8 * i));
  return s + json + data;
}

template <typename T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

}  // namespace

TEST_CASE("round trip is bit-exact for several dtypes, shapes and metadata") {
  TempDir dir;
  // Awkward floats: -0, denormal, inf, NaN with payload, extremes.
  std::vector<float> w = {-0.0f,
                          1e-45f,
                          std::numeric_limits<float>::infinity(),
                          3.5f,
                          std::numeric_limits<float>::max(),
                          -1.25e-30f};
  uint32_t nan_bits = 0x7fc12345;
  std::memcpy(&w[3], &nan_bits, 4);
  std::vector<uint16_t> bf16 = {0x3f80, 0xbf80, 0x7f80, 0x0001, 0xffff};  // BF16 bit patterns
  std::vector<int64_t> steps = {0, -1, std::numeric_limits<int64_t>::max(), 42};
  std::vector<uint8_t> flag = {1};
  std::vector<float> big(300000);  // spans a 1 MiB checksum chunk boundary
  for (size_t i = 0; i < big.size(); ++i) big[i] = std::sin(float(i));

  SafetensorsWriter wr;
  wr.add("layers.0.attn.q_proj.weight", "F32", {2, 3}, w.data(), w.size() * 4);
  wr.add("bf", "BF16", {5}, bf16.data(), bf16.size() * 2);
  wr.add("empty", "F32", {0, 5}, nullptr, 0);
  wr.add("step", "I64", {2, 2}, steps.data(), steps.size() * 8);
  wr.add("flag", "BOOL", {}, flag.data(), 1);
  wr.add("big", "F32", {300, 1000}, big.data(), big.size() * 4);
  wr.set_metadata("config", R"({"d_model": 128, "name": "tiny"})");
  wr.set_metadata("step", "17");
  const std::string path = dir.file("model.safetensors");
  wr.write(path);

  const std::string file = read_all(path);
  REQUIRE((8 + header_len(file)) % 8 == 0);  // data section starts 8-aligned
  REQUIRE(file.size() == 8 + header_len(file) + 24 + 10 + 32 + 1 + 1200000);
  REQUIRE(!std::filesystem::exists(path + ".tmp." + std::to_string(getpid())));

  SafetensorsReader r = SafetensorsReader::open(path);
  REQUIRE(r.path() == path);
  REQUIRE(r.names() == std::vector<std::string>{"layers.0.attn.q_proj.weight", "bf", "empty",
                                                "step", "flag", "big"});
  REQUIRE(r.metadata().size() == 3);
  REQUIRE(r.metadata().at("config") == R"({"d_model": 128, "name": "tiny"})");
  REQUIRE(r.metadata().at("step") == "17");
  REQUIRE(r.metadata().at(kChecksumKey).size() == 16);

  const TensorInfo& q = r.info("layers.0.attn.q_proj.weight");
  REQUIRE(q.dtype == "F32");
  REQUIRE(q.shape == std::vector<int64_t>{2, 3});
  REQUIRE(q.begin == 0);
  REQUIRE(q.end == 24);
  REQUIRE(r.info("bf").begin == 24);
  REQUIRE(r.info("flag").shape.empty());
  REQUIRE(r.info("flag").numel() == 1);
  REQUIRE(r.info("empty").numel() == 0);

  std::vector<float> back(6, 7.0f);
  r.read_f32("layers.0.attn.q_proj.weight", {2, 3}, back.data());
  REQUIRE(std::memcmp(back.data(), w.data(), 24) == 0);
  std::vector<float> big_back(big.size());
  r.read_f32("big", {300, 1000}, big_back.data());
  REQUIRE(std::memcmp(big_back.data(), big.data(), big.size() * 4) == 0);
  r.read_f32("empty", {0, 5}, nullptr);
  // A part of a tensor (a ZeRO-1 shard's share): elements [123456, 123456 + 1000) of "big".
  std::vector<float> part(1000, -1.0f);
  r.read_f32("big", {300, 1000}, part.data(), 123456, 1000);
  REQUIRE(std::memcmp(part.data(), big.data() + 123456, 4000) == 0);
  r.read_f32("big", {300, 1000}, nullptr, 0, 0);  // nothing to copy, the checks still run
  REQUIRE_THROWS_AS(r.read_f32("big", {300, 1000}, part.data(), 299500, 1000), RuntimeError);
  REQUIRE_THROWS_AS(r.read_f32("big", {300, 999}, nullptr, 0, 0), UsageError);
  REQUIRE(std::memcmp(r.raw("bf"), bf16.data(), 10) == 0);
  REQUIRE(std::memcmp(r.raw("step"), steps.data(), 32) == 0);
  REQUIRE(*static_cast<const uint8_t*>(r.raw("flag")) == 1);
}

TEST_CASE("a file with no tensors and no user metadata round-trips") {
  TempDir dir;
  SafetensorsWriter().write(dir.file("e.safetensors"));
  SafetensorsReader r = SafetensorsReader::open(dir.file("e.safetensors"));
  REQUIRE(r.names().empty());
  REQUIRE(r.metadata().size() == 1);
  REQUIRE(r.metadata().count(kChecksumKey) == 1);
  REQUIRE(!r.has("x"));
}

TEST_CASE("a hand-built file in the reference layout parses (no checksum, foreign order)") {
  TempDir dir;
  // As safetensors' Python writer lays it out: offsets relative to the data section, header
  // keys not in data order, metadata with "format": "pt", no trainer checksum.
  const std::vector<float> a = {1.5f, -2.0f};
  const std::vector<int32_t> b = {123456789};
  const std::string json =
      R"({"b":{"dtype":"I32","shape":[1,1],"data_offsets":[0,4]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},"__metadata__":{"format":"pt"}})";
  write_bytes(dir.file("ref.safetensors"), make_st(json, bytes_of(b) + bytes_of(a)));
  SafetensorsReader r = SafetensorsReader::open(dir.file("ref.safetensors"));
  REQUIRE(r.names() == std::vector<std::string>{"b", "a"});
  REQUIRE(r.metadata().size() == 1);
  REQUIRE(r.metadata().at("format") == "pt");
  std::vector<float> out(2);
  r.read_f32("a", {2}, out.data());
  REQUIRE(out[0] == 1.5f);
  REQUIRE(out[1] == -2.0f);
  int32_t bv = 0;
  std::memcpy(&bv, r.raw("b"), 4);  // 4 bytes after an 8-aligned header: fine for memcpy
  REQUIRE(bv == 123456789);
  REQUIRE(r.info("b").dtype == "I32");
}

TEST_CASE("checksum: thread-count independent, piece-split independent, sensitive to one bit") {
  std::vector<uint8_t> buf((size_t(7) << 19) + 13);  // 3.5 MiB + 13: four chunks, ragged tail
  std::mt19937_64 rng(7);
  for (auto& x : buf) x = static_cast<uint8_t>(rng());
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const uint64_t one = checksum64(buf.data(), buf.size());
  omp_set_num_threads(4);
  const uint64_t four = checksum64(buf.data(), buf.size());
  omp_set_num_threads(saved);
  REQUIRE(one == four);

  // Pieces that straddle chunk boundaries, with empty pieces in between.
  const uint8_t* p = buf.data();
  std::vector<ByteSpan> pieces = {{p, 5},
                                  {p + 5, 0},
                                  {p + 5, (size_t(1) << 20) + 3},
                                  {p + (size_t(1) << 20) + 8, 1},
                                  {p + (size_t(1) << 20) + 9, (size_t(2) << 20)},
                                  {nullptr, 0},
                                  {p + (size_t(3) << 20) + 9, buf.size() - (size_t(3) << 20) - 9}};
  REQUIRE(checksum64(pieces) == one);

  for (size_t pos : {size_t(0), size_t(31), size_t(1) << 20, buf.size() - 1, buf.size() / 2}) {
    for (uint8_t bit : {uint8_t(1), uint8_t(0x80)}) {
      buf[pos] ^= bit;
      REQUIRE(checksum64(buf.data(), buf.size()) != one);
      buf[pos] ^= bit;
    }
  }
  REQUIRE(checksum64(buf.data(), buf.size() - 1) != one);  // length matters
  REQUIRE(checksum64(nullptr, 0) != checksum64(buf.data(), 1));
}

TEST_CASE("truncated, flipped and garbage files are refused, naming the file") {
  TempDir dir;
  std::vector<float> w(1000);
  for (size_t i = 0; i < w.size(); ++i) w[i] = float(i) * 0.5f;
  SafetensorsWriter wr;
  wr.add("w", "F32", {10, 100}, w.data(), w.size() * 4);
  wr.set_metadata("step", "3");
  const std::string good_path = dir.file("good.safetensors");
  wr.write(good_path);
  const std::string good = read_all(good_path);
  const uint64_t n = header_len(good);

  const std::string bad = dir.file("bad.safetensors");
  auto refuse = [&](const std::string& bytes, const std::string& words) {
    write_bytes(bad, bytes);
    REQUIRE_THROWS_AS(SafetensorsReader::open(bad), UsageError);
    REQUIRE_THROWS_WITH(SafetensorsReader::open(bad),
                        ContainsSubstring(bad) && ContainsSubstring(words));
  };
  for (size_t cut : {size_t(0), size_t(5), size_t(8), size_t(8 + n / 2), size_t(8 + n),
                     size_t(8 + n + 3), good.size() - 1}) {
    INFO("cut at " << cut << " of " << good.size());
    refuse(good.substr(0, cut), "truncated");
  }
  std::string flipped = good;
  flipped[8 + n + 1234] ^= 0x10;
  refuse(flipped, "corrupt: checksum mismatch");
  std::string extra = good + "x";
  refuse(extra, "the data section has 4001 bytes but the tensors end at 4000");
  std::string garbage = good;
  std::memcpy(&garbage[8], "this is not json", 16);
  refuse(garbage, "not valid JSON");
  std::string bad_sum = good;
  const size_t at = bad_sum.find(kChecksumKey) + std::strlen(kChecksumKey) + 3;
  bad_sum[at] = 'Z';
  refuse(bad_sum, "is not 16 hex digits");
  refuse(make_st("[1, 2]", ""), "not a JSON object");
  std::string huge = good;
  huge[7] = 0x7f;  // header length ~ 2^62
  refuse(huge, "truncated: header length");
}

TEST_CASE("FIFOs, devices and directories are refused as safetensors files, at once") {
  TempDir dir;
  // --init-from and checkpoint files: open(2) of a FIFO with no writer blocks; it must not.
  check_special_files_refused(dir.file("model.safetensors"), "safetensors file",
                              [](const std::string& p) { (void)SafetensorsReader::open(p); });
  REQUIRE_THROWS_WITH(
      SafetensorsReader::open(dir.path),
      ContainsSubstring("safetensors file '" + dir.path + "' is not a regular file (a directory)"));
}

TEST_CASE("bad tensor entries are refused, naming the file and the tensor") {
  TempDir dir;
  const std::string bad = dir.file("bad.safetensors");
  const std::string d16(16, '\1');
  auto refuse = [&](const std::string& json, const std::string& data, const std::string& words) {
    write_bytes(bad, make_st(json, data));
    REQUIRE_THROWS_WITH(SafetensorsReader::open(bad),
                        ContainsSubstring(bad) && ContainsSubstring(words));
  };
  refuse(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
         R"("y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
         std::string(12, '\0'), "tensors 'x' [0, 8) and 'y' [4, 12) overlap");
  refuse(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", d16,
         "gap of 8 bytes before tensor 'x'");
  refuse(R"({"x":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})", d16,
         "tensor 'x' ends at byte 32 but the data section has only 16 bytes");
  refuse(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", d16,
         "tensor 'x' has 16 bytes but shape [3] of F32 needs 12");
  refuse(R"({"x":{"dtype":"Q4","shape":[4],"data_offsets":[0,16]}})", d16,
         "tensor 'x' has unknown dtype 'Q4'");
  refuse(R"({"x":{"shape":[4],"data_offsets":[0,16]}})", d16, "tensor 'x' lacks a string 'dtype'");
  refuse(R"({"x":{"dtype":"F32","data_offsets":[0,16]}})", d16, "tensor 'x' lacks a 'shape'");
  refuse(R"({"x":{"dtype":"F32","shape":[4]}})", d16, "tensor 'x' lacks 'data_offsets'");
  refuse(R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,-16]}})", d16,
         "tensor 'x' lacks 'data_offsets'");
  refuse(R"({"x":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", d16,
         "tensor 'x' has a bad shape");
  refuse(R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[16,0]}})", d16,
         "tensor 'x' has data_offsets [16, 0] with begin > end");
  refuse(R"({"x":[1,2]})", d16, "tensor 'x' is not a JSON object");
  refuse(R"({"__metadata__":{"k":3}})", "", "metadata 'k' is not a string");
}

TEST_CASE("read_f32 and lookups check dtype, shape and presence") {
  TempDir dir;
  std::vector<float> w(6, 1.0f);
  std::vector<int64_t> s = {1, 2};
  SafetensorsWriter wr;
  wr.add("w", "F32", {2, 3}, w.data(), 24);
  wr.add("s", "I64", {2}, s.data(), 16);
  const std::string path = dir.file("m.safetensors");
  wr.write(path);
  SafetensorsReader r = SafetensorsReader::open(path);
  std::vector<float> out(6);
  REQUIRE_THROWS_WITH(
      r.read_f32("w", {3, 2}, out.data()),
      ContainsSubstring(path) && ContainsSubstring("tensor 'w' has shape [2, 3], expected [3, 2]"));
  REQUIRE_THROWS_WITH(r.read_f32("s", {2}, out.data()),
                      ContainsSubstring(path) && ContainsSubstring("'s' has dtype I64 (need F32)"));
  REQUIRE_THROWS_WITH(r.read_f32("nope", {2}, out.data()),
                      ContainsSubstring(path) && ContainsSubstring("has no tensor 'nope'"));
  REQUIRE_THROWS_AS(r.info("nope"), UsageError);
  REQUIRE_THROWS_AS(r.raw("nope"), UsageError);
  REQUIRE(r.has("w"));
}

TEST_CASE("writes are atomic replacements; failures name the path; misuse is caught") {
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  std::vector<float> a(4, 1.0f), b(8, 2.0f);
  {
    SafetensorsWriter wr;
    wr.add("a", "F32", {4}, a.data(), 16);
    wr.write(path);
  }
  {
    SafetensorsWriter wr;
    wr.add("b", "F32", {8}, b.data(), 32);
    wr.write(path);  // replaces the old file
  }
  SafetensorsReader r = SafetensorsReader::open(path);
  REQUIRE(r.names() == std::vector<std::string>{"b"});
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path)) ++entries;
  REQUIRE(entries == 1);  // no temp files left behind

  const std::string nowhere = dir.file("no/such/dir/x.safetensors");
  REQUIRE_THROWS_WITH(SafetensorsWriter().write(nowhere),
                      ContainsSubstring(nowhere) && ContainsSubstring("No such file or directory"));
  REQUIRE_THROWS_WITH(SafetensorsReader::open(nowhere),
                      ContainsSubstring(nowhere) && ContainsSubstring("No such file or directory"));

  SafetensorsWriter wr;
  wr.add("a", "F32", {4}, a.data(), 16);
  REQUIRE_THROWS_AS(wr.add("a", "F32", {4}, a.data(), 16), RuntimeError);  // duplicate
  REQUIRE_THROWS_AS(wr.add("c", "F32", {5}, a.data(), 16), RuntimeError);  // size mismatch
  REQUIRE_THROWS_AS(wr.add("d", "F17", {4}, a.data(), 16), RuntimeError);  // unknown dtype
  REQUIRE_THROWS_AS(wr.set_metadata(kChecksumKey, "0"), RuntimeError);
}

TEST_CASE("a stream writes, in pieces of any size, the bytes the writer writes") {
  TempDir dir;
  std::vector<float> a(300000), b(7);  // `a` spans a 1 MiB checksum chunk boundary
  for (size_t i = 0; i < a.size(); ++i) a[i] = std::cos(float(i));
  for (size_t i = 0; i < b.size(); ++i) b[i] = float(i) - 3.5f;
  const std::map<std::string, std::string> meta = {{"step", "5"}};

  SafetensorsWriter wr;
  wr.add("a", "F32", {300, 1000}, a.data(), a.size() * 4);
  wr.add("b", "F32", {7}, b.data(), b.size() * 4);
  wr.set_metadata("step", "5");
  wr.write(dir.file("whole.safetensors"));

  // The bytes of both tensors in pieces that ignore tensor boundaries.
  std::vector<uint8_t> bytes(a.size() * 4 + b.size() * 4);
  std::memcpy(bytes.data(), a.data(), a.size() * 4);
  std::memcpy(bytes.data() + a.size() * 4, b.data(), b.size() * 4);
  const std::vector<TensorDecl> decls = {{"a", "F32", {300, 1000}}, {"b", "F32", {7}}};
  {
    SafetensorsStream s(dir.file("streamed.safetensors"), decls, meta);
    for (size_t at = 0, k = 1; at < bytes.size(); k = k * 7 % 1000003) {
      const size_t n = std::min(bytes.size() - at, k);
      s.append(bytes.data() + at, n);
      at += n;
    }
    REQUIRE_THROWS_AS(s.append(bytes.data(), 1), RuntimeError);  // past the declared bytes
    s.commit();
  }
  REQUIRE(read_all(dir.file("streamed.safetensors")) == read_all(dir.file("whole.safetensors")));
  const SafetensorsReader r = SafetensorsReader::open(dir.file("streamed.safetensors"));
  REQUIRE(r.metadata().at("step") == "5");

  // Dropped before commit (an error on the way): nothing appears, no temp file stays.
  {
    SafetensorsStream s(dir.file("dropped.safetensors"), decls, meta);
    s.append(bytes.data(), 100);
    REQUIRE_THROWS_AS(s.commit(), RuntimeError);  // 100 of the declared bytes
  }
  REQUIRE(std::distance(std::filesystem::directory_iterator(dir.path),
                        std::filesystem::directory_iterator()) == 2);

  // The streaming checksum refuses to be fed past its total or read before it.
  Checksum64 h(10);
  h.update(bytes.data(), 4);
  REQUIRE_THROWS_AS(h.value(), RuntimeError);
  REQUIRE_THROWS_AS(h.update(bytes.data(), 7), RuntimeError);
}
