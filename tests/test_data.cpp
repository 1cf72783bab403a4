// Token files (.npy / .bin parsing, uint16 and uint32 ids, every way they can be wrong, the
// tokenizer's vocabulary recorded beside them) and the SPEC.md samplers.
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/data.h"
#include "tests/catch.h"
#include "tests/scratch_files.h"

using namespace trainer;

namespace {

std::string u16_bytes(const std::vector<uint16_t>& v) {
  std::string s(v.size() * 2, '\0');
  for (size_t i = 0; i < v.size(); ++i) {
    s[2 * i] = static_cast<char>(v[i] & 0xff);
    s[2 * i + 1] = static_cast<char>(v[i] >> 8);
  }
  return s;
}

// A .npy file by hand: preamble of the given version, `dict` padded to 64 bytes, then `data`.
std::string make_npy(const std::string& dict, const std::string& data, int major = 1) {
  const size_t pre = major == 1 ? 10 : 12;
  const size_t total = (pre + dict.size() + 1 + 63) / 64 * 64;
  const size_t hlen = total - pre;
  std::string s = std::string("\x93NUMPY", 6) + static_cast<char>(major) + '\0';
  s += static_cast<char>(hlen & 0xff);
  s += static_cast<char>((hlen >> 8) & 0xff);
  if (major != 1) s += std::string("\0\0", 2);
  s += dict + std::string(hlen - dict.size() - 1, ' ') + '\n';
  return s + data;
}

}  // namespace

TEST_CASE("sequential sampler: o = ((s*G + r) * T) mod (N - T - 1)") {
  Sampler s{SamplerKind::kSequential, 7, 1000, 16, 8};  // M = 1000 - 16 - 1 = 983
  REQUIRE(s.offset(0, 0) == 0);
  REQUIRE(s.offset(0, 1) == 16);
  REQUIRE(s.offset(3, 5) == 464);   // (3*8 + 5) * 16 = 464
  REQUIRE(s.offset(10, 7) == 409);  // 87 * 16 = 1392 = 983 + 409
  REQUIRE(s.offset(61, 3) == (61 * 8 + 3) * 16 % 983);
  // The product overflows 64 bits: (2^60 * 64 + 3) * 1024 mod 1000003 = 412716 (by Python).
  Sampler big{SamplerKind::kSequential, 0, 1000003 + 1024 + 1, 1024, 64};
  REQUIRE(big.offset(int64_t(1) << 60, 3) == 412716);
  REQUIRE_THROWS_AS(s.offset(0, 8), RuntimeError);  // row outside [0, G)
}

TEST_CASE("random sampler matches the reference hash") {
  // Values from a Python transcription of the splitmix64 chain + Lemire reduction. Pinning them
  // means a change of data order (which would break resumed runs) cannot go unnoticed.
  REQUIRE(Sampler{SamplerKind::kRandom, 1234, 1000, 16, 8}.offset(5, 7) == 333);
  REQUIRE(Sampler{SamplerKind::kRandom, 0, 1000, 16, 8}.offset(0, 0) == 136);
  REQUIRE(Sampler{SamplerKind::kRandom, 42, 1000000007 + 8 + 1, 8, 64}.offset(1000000, 63) ==
          178426484);
  REQUIRE(Sampler{SamplerKind::kRandom, ~uint64_t(0), 12345 + 4 + 1, 4, 2}.offset(3, 0) == 1274);
}

TEST_CASE("random sampler: deterministic, in range, independent of G, varies with seed/step/row") {
  const int64_t N = 50000, T = 64, M = N - T - 1;
  Sampler a{SamplerKind::kRandom, 1, N, T, 32};
  Sampler a_wide{SamplerKind::kRandom, 1, N, T, 4096};  // another world size: same rows
  Sampler b{SamplerKind::kRandom, 2, N, T, 32};
  int same_seed = 0, same_step = 0, same_row = 0;
  for (int64_t s = 0; s < 50; ++s) {
    for (int64_t r = 0; r < 32; ++r) {
      const int64_t o = a.offset(s, r);
      REQUIRE(o >= 0);
      REQUIRE(o < M);
      REQUIRE(a.offset(s, r) == o);
      REQUIRE(a_wide.offset(s, r) == o);
      same_seed += b.offset(s, r) == o;
      same_step += a.offset(s + 1, r) == o;
      same_row += a.offset(s, (r + 1) % 32) == o;
    }
  }
  // 1600 pairs each; a chance match has probability 1/M, so even 3 would be remarkable.
  REQUIRE(same_seed <= 2);
  REQUIRE(same_step <= 2);
  REQUIRE(same_row <= 2);
}

TEST_CASE("random sampler is roughly uniform") {
  const int64_t bins = 16, M = bins * 1000, T = 8;
  Sampler s{SamplerKind::kRandom, 99, M + T + 1, T, 100};
  std::vector<int64_t> count(bins, 0);
  const int64_t draws = 100000;
  for (int64_t step = 0; step < draws / 100; ++step)
    for (int64_t r = 0; r < 100; ++r) ++count[s.offset(step, r) / 1000];
  const double expect = double(draws) / bins;
  double chi2 = 0;
  for (int64_t c : count) chi2 += (c - expect) * (c - expect) / expect;
  // 15 degrees of freedom: mean 15, sd 5.5; P(chi2 > 60) ~ 1e-7.
  INFO("chi2 = " << chi2);
  REQUIRE(chi2 < 60.0);
  // The low bits are uniform too (offset mod 16 over a range that is a multiple of 16).
  std::vector<int64_t> low(bins, 0);
  for (int64_t step = 0; step < draws / 100; ++step)
    for (int64_t r = 0; r < 100; ++r) ++low[s.offset(step, r) % bins];
  double chi2_low = 0;
  for (int64_t c : low) chi2_low += (c - expect) * (c - expect) / expect;
  INFO("chi2 (low bits) = " << chi2_low);
  REQUIRE(chi2_low < 60.0);
}

TEST_CASE("parse_sampler") {
  REQUIRE(parse_sampler("sequential") == SamplerKind::kSequential);
  REQUIRE(parse_sampler("random") == SamplerKind::kRandom);
  REQUIRE(std::string(sampler_name(SamplerKind::kRandom)) == "random");
  REQUIRE_THROWS_WITH(parse_sampler("shuffle"),
                      ContainsSubstring("--sampler") && ContainsSubstring("'shuffle'"));
}

TEST_CASE("llm.c token shards: read past their header; other versions and sizes refused") {
  TempDir dir;
  std::vector<uint16_t> tok(300);
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<uint16_t>(i * 7 % 50257);
  auto shard = [&](const std::string& name, int32_t version, int32_t count, size_t tokens) {
    std::vector<int32_t> header(256, 0);
    header[0] = 20240520;
    header[1] = version;
    header[2] = count;
    std::string bytes(reinterpret_cast<const char*>(header.data()), header.size() * 4);
    bytes.append(reinterpret_cast<const char*>(tok.data()), tokens * 2);
    write_bytes(dir.file(name), bytes);
    return dir.file(name);
  };
  const TokenFile t = TokenFile::open(shard("ok.bin", 1, 300, 300));
  REQUIRE(t.size() == 300);
  CHECK(std::equal(tok.begin(), tok.end(), t.u16()));
  REQUIRE_THROWS_WITH(TokenFile::open(shard("v2.bin", 2, 150, 300)),
                      ContainsSubstring("llm.c shard of version 2"));
  REQUIRE_THROWS_WITH(TokenFile::open(shard("short.bin", 1, 300, 299)),
                      ContainsSubstring("header says 300 tokens"));
}

TEST_CASE("several token files read as their concatenation: lists and globs") {
  TempDir dir;
  std::vector<uint16_t> tok(1000);
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<uint16_t>((i * 7919) % 65536);
  write_token_file(dir.file("all.bin"), tok.data(), 1000);
  // Shards of uneven sizes, one of them a .npy, named so that name order is token order.
  const int64_t cuts[] = {0, 7, 300, 301, 1000};
  for (int k = 0; k < 4; ++k) {
    const std::string name = dir.file("shard_" + std::to_string(k) + (k == 2 ? ".npy" : ".bin"));
    if (k == 2)
      write_npy_u16(name, tok.data() + cuts[k], cuts[k + 1] - cuts[k]);
    else
      write_token_file(name, tok.data() + cuts[k], cuts[k + 1] - cuts[k]);
  }
  const TokenStream one = TokenStream::open(dir.file("all.bin"));
  const std::string list = dir.file("shard_0.bin") + "," + dir.file("shard_1.bin") + "," +
                           dir.file("shard_2.npy") + "," + dir.file("shard_3.bin");
  for (const std::string& spec :
       {list, dir.file("shard_*"), dir.file("shard_[01].bin") + "," + dir.file("shard_[23].*")}) {
    INFO(spec);
    const TokenStream many = TokenStream::open(spec);
    REQUIRE(many.files().size() == 4);
    REQUIRE(many.size() == 1000);
    // Every window, across every boundary, reads what the single file holds.
    std::vector<int32_t> a(12), b(12);
    for (int64_t o = 0; o + 12 <= 1000; ++o) {
      one.read(o, 12, a.data());
      many.read(o, 12, b.data());
      REQUIRE(a == b);
    }
    const Sampler s{SamplerKind::kRandom, 3, 1000, 10, 8};
    std::vector<int32_t> in1(80), tg1(80), in2(80), tg2(80);
    fill_rows(one, s, 2, 0, 8, in1.data(), tg1.data());
    fill_rows(many, s, 2, 0, 8, in2.data(), tg2.data());
    REQUIRE(in1 == in2);
    REQUIRE(tg1 == tg2);
  }
  REQUIRE_THROWS_WITH(TokenStream::open(dir.file("nothing_*.bin")),
                      ContainsSubstring("matches no file"));
  REQUIRE_THROWS_WITH(TokenStream::open(dir.file("all.bin") + ","),
                      ContainsSubstring("an empty file name"));
  REQUIRE_THROWS_WITH(TokenStream::open(dir.file("shard_0.bin") + "," + dir.file("missing.bin")),
                      ContainsSubstring("missing.bin"));
  // Too short in all: the message names the list.
  REQUIRE_THROWS_WITH(
      TokenStream::open(dir.file("shard_0.bin") + "," + dir.file("shard_2.npy")).check_length(8),
      ContainsSubstring("too short: 8 tokens in all"));
}

TEST_CASE("npy and bin round trip; fill_rows returns the shifted windows") {
  TempDir dir;
  std::vector<uint16_t> tok(1000);
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<uint16_t>((i * 7919) % 65536);
  write_npy_u16(dir.file("t.npy"), tok.data(), static_cast<int64_t>(tok.size()));
  write_token_file(dir.file("t.bin"), tok.data(), static_cast<int64_t>(tok.size()));
  // NumPy 1.0 layout: 10-byte preamble + 60-byte dict + '\n' padded to 128, as NumPy writes it.
  REQUIRE(std::filesystem::file_size(dir.file("t.npy")) == 128 + 2 * tok.size());
  {
    std::ifstream f(dir.file("t.npy"), std::ios::binary);
    std::string head(128, '\0');
    f.read(head.data(), 128);
    REQUIRE(head.substr(0, 10) == std::string("\x93NUMPY\x01\x00\x76\x00", 10));
    REQUIRE(head.substr(10, 60) == "{'descr': '<u2', 'fortran_order': False, 'shape': (1000,), }");
    REQUIRE(head[127] == '\n');
  }
  REQUIRE(std::filesystem::file_size(dir.file("t.bin")) == 2 * tok.size());
  REQUIRE(!std::filesystem::exists(dir.file("t.npy.tmp." + std::to_string(getpid()))));

  for (const char* name : {"t.npy", "t.bin"}) {
    TokenFile f = TokenFile::open(dir.file(name));
    REQUIRE(f.path() == dir.file(name));
    REQUIRE(f.size() == 1000);
    REQUIRE(f.dtype() == TokenDtype::kU16);
    REQUIRE(f.u32() == nullptr);
    REQUIRE(std::vector<uint16_t>(f.u16(), f.u16() + f.size()) == tok);
    TokenFile moved = std::move(f);  // the mapping moves with it
    REQUIRE(moved.u16()[999] == tok[999]);

    const TokenStream stream = TokenStream::open(dir.file(name));
    const int64_t T = 10, G = 6;
    for (SamplerKind kind : {SamplerKind::kSequential, SamplerKind::kRandom}) {
      Sampler s{kind, 5, stream.size(), T, G};
      std::vector<int32_t> in(3 * T), tg(3 * T);
      fill_rows(stream, s, 4, 2, 3, in.data(), tg.data());  // rows 2, 3, 4 of step 4
      for (int64_t i = 0; i < 3; ++i) {
        const int64_t o = s.offset(4, 2 + i);
        if (kind == SamplerKind::kSequential) REQUIRE(o == ((4 * G + 2 + i) * T) % (1000 - T - 1));
        for (int64_t t = 0; t < T; ++t) {
          REQUIRE(in[i * T + t] == tok[o + t]);
          REQUIRE(tg[i * T + t] == tok[o + t + 1]);
        }
      }
    }
  }
}

TEST_CASE("npy headers in other valid spellings are accepted") {
  TempDir dir;
  const std::string data = u16_bytes({1, 2, 3, 65535, 5});
  // Version 2.0, double quotes, keys in another order, no trailing comma.
  write_bytes(dir.file("v2.npy"),
              make_npy("{\"shape\": (5,), \"fortran_order\": False, \"descr\": \"<u2\"}", data, 2));
  write_bytes(dir.file("v3.npy"),
              make_npy("{'descr':'<u2','fortran_order':False,'shape':(5L,),}", data, 3));
  for (const char* name : {"v2.npy", "v3.npy"}) {
    TokenFile f = TokenFile::open(dir.file(name));
    REQUIRE(f.size() == 5);
    REQUIRE(f.u16()[3] == 65535);
    REQUIRE(f.u16()[4] == 5);
  }
  // An empty array and an empty .bin are valid files (check_length refuses them later).
  write_bytes(dir.file("e.npy"),
              make_npy("{'descr': '<u2', 'fortran_order': False, 'shape': (0,), }", ""));
  write_bytes(dir.file("e.bin"), "");
  REQUIRE(TokenFile::open(dir.file("e.npy")).size() == 0);
  REQUIRE(TokenFile::open(dir.file("e.bin")).size() == 0);
}

TEST_CASE("bad token files are refused with a message naming the file and the defect") {
  TempDir dir;
  const std::string good_dict = "{'descr': '<u2', 'fortran_order': False, 'shape': (6,), }";
  const std::string data = u16_bytes({1, 2, 3, 4, 5, 6});
  auto check = [&](const std::string& name, const std::string& bytes, const std::string& words) {
    write_bytes(dir.file(name), bytes);
    REQUIRE_THROWS_AS(TokenFile::open(dir.file(name)), UsageError);
    REQUIRE_THROWS_WITH(TokenFile::open(dir.file(name)),
                        ContainsSubstring(dir.file(name)) && ContainsSubstring(words));
  };
  check("i4.npy", make_npy("{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }", data),
        "dtype '<i4' (need '<u2' = uint16 or '<u4' = uint32)");
  check("be.npy", make_npy("{'descr': '>u2', 'fortran_order': False, 'shape': (6,), }", data),
        "dtype '>u2'");
  check("be4.npy", make_npy("{'descr': '>u4', 'fortran_order': False, 'shape': (3,), }", data),
        "dtype '>u4'");
  check("u8.npy", make_npy("{'descr': '<u8', 'fortran_order': False, 'shape': (1,), }", data),
        "dtype '<u8'");
  // 12 bytes are 3 uint32 ids, not 6.
  check("trunc4.npy", make_npy("{'descr': '<u4', 'fortran_order': False, 'shape': (6,), }", data),
        "truncated: header says 6 tokens but 12 bytes follow");
  check("long4.npy", make_npy("{'descr': '<u4', 'fortran_order': False, 'shape': (2,), }", data),
        "4 bytes after its data");
  check("2d.npy", make_npy("{'descr': '<u2', 'fortran_order': False, 'shape': (3, 2), }", data),
        "2-D shape (3, 2) (need 1-D)");
  check("0d.npy", make_npy("{'descr': '<u2', 'fortran_order': False, 'shape': (), }", data),
        "0-D shape ()");
  check("f.npy", make_npy("{'descr': '<u2', 'fortran_order': True, 'shape': (6,), }", data),
        "Fortran order");
  check("trunc.npy",
        make_npy("{'descr': '<u2', 'fortran_order': False, 'shape': (1000,), }",
                 std::string(200, 'x')),
        "truncated: header says 1000 tokens but 200 bytes follow");
  check("long.npy", make_npy(good_dict, data + "zz"), "2 bytes after its data");
  check("magic.npy", "\x93NUMPZ" + make_npy(good_dict, data).substr(6), "bad magic");
  check("short.npy", std::string("\x93NUM", 4), "bad magic");
  check("hdr.npy", make_npy(good_dict, data).substr(0, 40), "truncated");
  check("ver.npy", make_npy(good_dict, data, 4), "unsupported .npy version 4.0");
  check("garbage.npy", make_npy("{'descr': <u2}", data), "cannot parse the .npy header");
  check("noshape.npy", make_npy("{'descr': '<u2', 'fortran_order': False}", data), "'shape'");
  check("odd.bin", "abc", "odd size (3 bytes)");
  check("npy_named.bin", make_npy(good_dict, data), "starts with the .npy magic");
  // A missing file and a directory.
  REQUIRE_THROWS_WITH(
      TokenFile::open(dir.file("missing.bin")),
      ContainsSubstring(dir.file("missing.bin")) && ContainsSubstring("No such file or directory"));
  REQUIRE_THROWS_WITH(TokenFile::open(dir.path),
                      ContainsSubstring(dir.path) && ContainsSubstring("not a regular file"));
}

TEST_CASE("FIFOs and devices are refused as token files, at once and naming the file") {
  TempDir dir;
  // open(2) of a FIFO with no writer blocks; the check must come first (--data, --val-data). A
  // character device never ends (/dev/zero) or is empty (/dev/null); neither is a token file.
  for (const char* name : {"fifo.npy", "fifo.bin"})
    check_special_files_refused(dir.file(name), "token file",
                                [](const std::string& p) { (void)TokenFile::open(p); });
}

TEST_CASE("a .npy named .bin is refused instead of training on its header bytes") {
  TempDir dir;
  const std::string data = u16_bytes({1, 2, 3, 4, 5, 6});
  const std::string npy =
      make_npy("{'descr': '<u2', 'fortran_order': False, 'shape': (6,), }", data);
  for (const char* name : {"tokens.bin", "tokens", "tokens.u16"}) {
    const std::string path = dir.file(name);
    write_bytes(path, npy);
    REQUIRE_THROWS_AS(TokenFile::open(path), UsageError);
    REQUIRE_THROWS_WITH(
        TokenFile::open(path),
        ContainsSubstring("token file '" + path +
                          "' starts with the .npy magic (\\x93NUMPY): name it .npy"));
  }
  // The same bytes named .npy load; a raw file that merely starts with 0x93 is still raw tokens.
  write_bytes(dir.file("tokens.npy"), npy);
  REQUIRE(TokenFile::open(dir.file("tokens.npy")).size() == 6);
  write_bytes(dir.file("raw.bin"), std::string("\x93NUMPZ", 6));
  REQUIRE(TokenFile::open(dir.file("raw.bin")).size() == 3);
}

TEST_CASE("check_vocab and check_length") {
  TempDir dir;
  std::vector<uint16_t> tok(100000);
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<uint16_t>(i % 256);
  tok[77777] = 300;
  tok[88888] = 9999;
  write_token_file(dir.file("v.bin"), tok.data(), static_cast<int64_t>(tok.size()));
  TokenFile f = TokenFile::open(dir.file("v.bin"));
  f.check_vocab(10000);  // every id < 10000
  f.check_vocab(65536);
  REQUIRE_THROWS_WITH(f.check_vocab(256), ContainsSubstring(dir.file("v.bin")) &&
                                              ContainsSubstring("token id 300 at position 77777"));
  REQUIRE_THROWS_WITH(f.check_vocab(301), ContainsSubstring("token id 9999 at position 88888"));

  f.check_length(100000 - 2);  // exactly ctx + 2 tokens
  REQUIRE_THROWS_WITH(f.check_length(100000 - 1), ContainsSubstring(dir.file("v.bin")) &&
                                                      ContainsSubstring("too short") &&
                                                      ContainsSubstring("needs at least 100001"));
}

namespace {

std::string u32_bytes(const std::vector<uint32_t>& v) {
  std::string s(v.size() * 4, '\0');
  for (size_t i = 0; i < v.size(); ++i)
    for (int b = 0; b < 4; ++b) s[4 * i + b] = static_cast<char>((v[i] >> (8 * b)) & 0xff);
  return s;
}

}  // namespace

TEST_CASE("uint32 .npy: read in place, and the same batches as uint16 for the same ids") {
  TempDir dir;
  std::vector<uint16_t> tok16(1000);
  for (size_t i = 0; i < tok16.size(); ++i) tok16[i] = static_cast<uint16_t>((i * 7919) % 65536);
  const std::vector<uint32_t> tok32(tok16.begin(), tok16.end());
  write_npy_u16(dir.file("t16.npy"), tok16.data(), 1000);
  write_npy_u32(dir.file("t32.npy"), tok32.data(), 1000);
  // NumPy 1.0 layout: the same 128-byte header with '<u4', then 4 bytes an id.
  REQUIRE(std::filesystem::file_size(dir.file("t32.npy")) == 128 + 4 * tok32.size());
  REQUIRE(read_all(dir.file("t32.npy")).substr(10, 60) ==
          "{'descr': '<u4', 'fortran_order': False, 'shape': (1000,), }");

  const TokenFile f = TokenFile::open(dir.file("t32.npy"));
  REQUIRE(f.dtype() == TokenDtype::kU32);
  REQUIRE(std::string(dtype_name(f.dtype())) == "uint32");
  REQUIRE(f.u16() == nullptr);
  REQUIRE(f.size() == 1000);
  REQUIRE(std::vector<uint32_t>(f.u32(), f.u32() + f.size()) == tok32);

  const TokenStream s16 = TokenStream::open(dir.file("t16.npy"));
  const TokenStream s32 = TokenStream::open(dir.file("t32.npy"));
  // A uint16 and a uint32 shard read as one stream: widths may differ from file to file.
  write_npy_u32(dir.file("a.npy"), tok32.data(), 400);
  write_npy_u16(dir.file("b.npy"), tok16.data() + 400, 600);
  const TokenStream mixed = TokenStream::open(dir.file("a.npy") + "," + dir.file("b.npy"));
  for (SamplerKind kind : {SamplerKind::kSequential, SamplerKind::kRandom}) {
    const Sampler s{kind, 11, 1000, 16, 8};
    for (int64_t step = 0; step < 20; ++step) {
      std::vector<int32_t> in16(128), tg16(128), in32(128), tg32(128), inm(128), tgm(128);
      fill_rows(s16, s, step, 0, 8, in16.data(), tg16.data());
      fill_rows(s32, s, step, 0, 8, in32.data(), tg32.data());
      fill_rows(mixed, s, step, 0, 8, inm.data(), tgm.data());
      REQUIRE(in16 == in32);
      REQUIRE(tg16 == tg32);
      REQUIRE(in16 == inm);
      REQUIRE(tg16 == tgm);
    }
  }
}

TEST_CASE("uint32 ids past 65535 round-trip; check_vocab scans them") {
  TempDir dir;
  std::vector<uint32_t> tok(100000);
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<uint32_t>(i % 70000);
  tok[5] = 65536;
  tok[77777] = 100000;
  tok[88888] = 4000000000u;  // past INT32_MAX: read() would wrap it, check_vocab refuses it
  write_npy_u32(dir.file("v.npy"), tok.data(), static_cast<int64_t>(tok.size()));
  // The same ids through a .npy written by hand (as NumPy would) read alike.
  write_bytes(dir.file("hand.npy"),
              make_npy("{'descr': '<u4', 'fortran_order': False, 'shape': (5,), }",
                       u32_bytes({0, 65535, 65536, 70000, 4294967295u})));
  const TokenFile hand = TokenFile::open(dir.file("hand.npy"));
  REQUIRE(std::vector<uint32_t>(hand.u32(), hand.u32() + 5) ==
          std::vector<uint32_t>{0, 65535, 65536, 70000, 4294967295u});

  const TokenFile f = TokenFile::open(dir.file("v.npy"));
  REQUIRE(f.u32()[5] == 65536);
  REQUIRE(f.u32()[77777] == 100000);
  const TokenStream stream = TokenStream::open(dir.file("v.npy"));
  std::vector<int32_t> got(4);
  stream.read(3, 4, got.data());
  REQUIRE(got == std::vector<int32_t>{3, 4, 65536, 6});
  stream.read(77776, 3, got.data());
  REQUIRE(got[1] == 100000);

  f.check_vocab(int64_t{1} << 32);  // every uint32 fits
  REQUIRE_THROWS_WITH(f.check_vocab(70000), ContainsSubstring(dir.file("v.npy")) &&
                                                ContainsSubstring("token id 100000 at position "
                                                                  "77777"));
  REQUIRE_THROWS_WITH(f.check_vocab(65536), ContainsSubstring("token id 65536 at position 5"));
  REQUIRE_THROWS_WITH(f.check_vocab(100001),
                      ContainsSubstring("token id 4000000000 at position 88888") &&
                          ContainsSubstring("outside the vocabulary of 100001"));
  tok[88888] = 7;
  write_npy_u32(dir.file("ok.npy"), tok.data(), static_cast<int64_t>(tok.size()));
  TokenFile::open(dir.file("ok.npy")).check_vocab(100001);
  TokenStream::open(dir.file("ok.npy")).check_vocab(100001);
}

TEST_CASE("the tokenizer's vocabulary in meta.json beside the tokens bounds --vocab") {
  TempDir dir;
  std::filesystem::create_directories(dir.file("a"));
  std::filesystem::create_directories(dir.file("b"));
  std::vector<uint16_t> tok(200);
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<uint16_t>(i % 100);
  for (const char* name : {"a/train.npy", "a/val.npy", "b/more.npy"})
    write_npy_u16(dir.file(name), tok.data(), static_cast<int64_t>(tok.size()));
  REQUIRE(!recorded_vocab_size(dir.file("a/train.npy")));  // no meta.json: no bound
  TokenStream::open(dir.file("a/train.npy")).check_vocab(100);

  // As launch/prepare_text.py writes it (abridged).
  write_bytes(dir.file("a/meta.json"),
              R"({"producer": "launch/prepare_text.py", "vocab_size": 8192, "dtype": "uint16",
                  "train_tokens": 200, "eot_id": 0})");
  REQUIRE(recorded_vocab_size(dir.file("a/train.npy")) == 8192);
  const TokenStream a = TokenStream::open(dir.file("a/train.npy"));
  a.check_vocab(8192);
  a.check_vocab(10000);
  // The ids (< 100) would fit 256; the tokenizer's vocabulary does not.
  REQUIRE_THROWS_AS(a.check_vocab(256), UsageError);
  REQUIRE_THROWS_WITH(
      a.check_vocab(256),
      ContainsSubstring("--vocab 256 is smaller than the vocabulary of the tokenizer") &&
          ContainsSubstring("8192 tokens") && ContainsSubstring(dir.file("a/train.npy")) &&
          ContainsSubstring(dir.file("a/meta.json")) && ContainsSubstring("--vocab 8192 or more"));
  TokenFile::open(dir.file("a/train.npy")).check_vocab(256);  // the file alone knows no tokenizer
  // In a list, a file from a directory with a meta.json carries its bound into the stream.
  const TokenStream ab = TokenStream::open(dir.file("b/more.npy") + "," + dir.file("a/val.npy"));
  REQUIRE_THROWS_WITH(ab.check_vocab(8191), ContainsSubstring(dir.file("a/val.npy")));
  ab.check_vocab(8192);

  // Someone else's meta.json (not JSON, no integer vocab_size) bounds nothing.
  for (const char* other :
       {"not json at all", "[1, 2]", R"({"vocab_size": "big"})", R"({"name": "my corpus"})"}) {
    INFO(other);
    write_bytes(dir.file("b/meta.json"), other);
    REQUIRE(!recorded_vocab_size(dir.file("b/more.npy")));
    TokenStream::open(dir.file("b/more.npy")).check_vocab(100);
  }
  // A directory named meta.json is no meta.json either.
  std::filesystem::remove(dir.file("b/meta.json"));
  std::filesystem::create_directories(dir.file("b/meta.json"));
  REQUIRE(!recorded_vocab_size(dir.file("b/more.npy")));
}
