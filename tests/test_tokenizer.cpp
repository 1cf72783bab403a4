// The byte-level BPE tokenizer (runtime/tokenizer.h) on small tokenizer.json files built here:
// encodings worked out by hand, GPT-2's pre-tokenization pieces, round trips of any bytes,
// added tokens, and every refusal with its message. tests/tokenizer_hf_check.py compares with
// Hugging Face tokenizers itself.
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "runtime/tokenizer.h"
#include "tests/catch.h"
#include "tests/scratch_files.h"

using namespace trainer;
using json = nlohmann::json;

namespace {

// GPT-2's symbol of byte b (printable Latin-1 stands for itself, the rest from U+0100 on).
std::string sym(int b) {
  int cp = b, next = 256;
  const auto printable = [](int c) { return (c >= 33 && c <= 126) || (c >= 161 && c != 173); };
  if (!printable(b))
    for (int k = 0; k <= b; ++k)
      if (!printable(k)) cp = next++;
  std::string s;
  if (cp < 0x80) return s += static_cast<char>(cp);
  s += static_cast<char>(0xC0 | cp >> 6);
  return s += static_cast<char>(0x80 | (cp & 0x3F));
}

const std::string G = sym(' '), C = sym('\n');  // "Ġ", "Ċ"

// Ids 0..255 are the bytes; each merge adds its token (ids 256.. in merge order); the added
// tokens follow with the ids HF gives them. Merges in the current ["a", "b"] form.
json make_tokenizer(const std::vector<std::pair<std::string, std::string>>& merges,
                    const std::vector<std::string>& special = {"<|endoftext|>"}) {
  json vocab = json::object(), merge_list = json::array();
  for (int b = 0; b < 256; ++b) vocab[sym(b)] = b;
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = vocab.size();
    merge_list.push_back({a, b});
  }
  json added = json::array();
  for (const std::string& s : special)
    added.push_back({{"id", vocab.size() + added.size()},
                     {"content", s},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  const json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", true}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", byte_level},
          {"post_processor", byte_level},
          {"decoder", byte_level},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", merge_list}}}};
}

// Ranks: Ġt 256, he 257, Ġthe 258, in 259, ing 260, 's 261, ĠĠ 262, ĊĠ 263, ĊĊ 264, é 265.
const std::vector<std::pair<std::string, std::string>> kMerges = {
    {G, "t"},   {"h", "e"}, {G + "t", "he"}, {"i", "n"}, {"in", "g"},
    {"'", "s"}, {G, G},     {C, G},          {C, C},     {sym(0xC3), sym(0xA9)}};

BpeTokenizer parse(const json& j) { return BpeTokenizer::parse(j.dump(), "test.json"); }

std::vector<int32_t> bytes_of(const std::string& s) {
  std::vector<int32_t> ids;
  for (char c : s) ids.push_back(static_cast<uint8_t>(c));
  return ids;
}

using Pieces = std::vector<std::string>;

// The message of the UsageError that parsing `j` throws ("" if none).
std::string refusal(const json& j) {
  try {
    parse(j);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("tokenizer: hand-worked encodings") {
  const BpeTokenizer tok = parse(make_tokenizer(kMerges));
  const int32_t eot = 266;
  REQUIRE(tok.vocab_size() == 267);
  REQUIRE(tok.token_id("<|endoftext|>") == eot);
  REQUIRE(tok.token_id(G + "the") == 258);
  REQUIRE(tok.token_id("nope") == std::nullopt);

  REQUIRE(tok.encode("") == std::vector<int32_t>{});
  REQUIRE(tok.encode("the") == std::vector<int32_t>{'t', 257});  // "Ġt" needs the space
  REQUIRE(tok.encode(" the") == std::vector<int32_t>{258});
  // (i, n) merges first, then (in, g); (t, h) is no merge.
  REQUIRE(tok.encode("thing") == std::vector<int32_t>{'t', 'h', 260});
  REQUIRE(tok.encode("it's") == std::vector<int32_t>{'i', 't', 261});
  REQUIRE(tok.encode("  the") == std::vector<int32_t>{' ', 258});
  // Equal ranks: the leftmost pair merges first.
  REQUIRE(tok.encode("a   ") == std::vector<int32_t>{'a', 262, ' '});
  // "  \n\n" is one piece (ĠĠ ĊĊ); with the space of " b" it would merge ĊĠ first.
  REQUIRE(tok.encode("a  \n\n b") == std::vector<int32_t>{'a', 262, 264, ' ', 'b'});
  REQUIRE(tok.encode("\n \nb") == std::vector<int32_t>{263, '\n', 'b'});
  REQUIRE(tok.encode("caf\xc3\xa9") == std::vector<int32_t>{'c', 'a', 'f', 265});
  // Added tokens are cut out before anything else, also inside words.
  REQUIRE(tok.encode("the<|endoftext|> the") == std::vector<int32_t>{'t', 257, eot, 258});
  REQUIRE(tok.encode("<|endoftext|><|endoftext|>") == std::vector<int32_t>{eot, eot});
  REQUIRE(tok.encode("<|endoftext|") == bytes_of("<|endoftext|"));
}

TEST_CASE("tokenizer: GPT-2 pre-tokenization pieces") {
  const auto split = BpeTokenizer::split_pieces;
  REQUIRE(split("Hello world, it's 2024!") ==
          Pieces{"Hello", " world", ",", " it", "'s", " 2024", "!"});
  // Contractions are lower case only; "'x" is punctuation.
  REQUIRE(split("we're I'LL 'x") == Pieces{"we", "'re", " I", "'", "LL", " '", "x"});
  REQUIRE(split("you've he'd I'm we'll") ==
          Pieces{"you", "'ve", " he", "'d", " I", "'m", " we", "'ll"});
  // \s+(?!\S): a run of spaces leaves its last one to the next word; at the end it stays whole.
  REQUIRE(split("a  \n\n b") == Pieces{"a", "  \n\n", " b"});
  REQUIRE(split("hello   ") == Pieces{"hello", "   "});
  REQUIRE(split("a \tb") == Pieces{"a", " ", "\t", "b"});
  REQUIRE(split("\n\nx") == Pieces{"\n", "\n", "x"});
  // Unicode letters, numbers, spaces (U+00A0, U+3000) and the rest (emoji with punctuation).
  REQUIRE(split("na\xc3\xafve caf\xc3\xa9") == Pieces{"na\xc3\xafve", " caf\xc3\xa9"});
  REQUIRE(split("x\xd9\xa3"
                "3 \xe6\x9d\xb1\xe4\xba\xac"
                "12") == Pieces{"x",
                                "\xd9\xa3"
                                "3",
                                " \xe6\x9d\xb1\xe4\xba\xac", "12"});
  REQUIRE(split("\xc2\xa0"
                "a") == Pieces{"\xc2\xa0", "a"});
  REQUIRE(split("a\xe3\x80\x80\xe3\x80\x80"
                "b") == Pieces{"a", "\xe3\x80\x80", "\xe3\x80\x80", "b"});
  REQUIRE(split("ok \xf0\x9f\x99\x82\xf0\x9f\x99\x82!") ==
          Pieces{"ok", " \xf0\x9f\x99\x82\xf0\x9f\x99\x82!"});
  // Invalid UTF-8: each byte is "other", like punctuation.
  REQUIRE(split("a\xff\xfe"
                "b \xc3") == Pieces{"a", "\xff\xfe", "b", " \xc3"});
  REQUIRE(split("\xe6\x9d"
                "x") == Pieces{"\xe6\x9d", "x"});  // a cut character
}

TEST_CASE("tokenizer: decode(encode(x)) == x") {
  const BpeTokenizer tok = parse(make_tokenizer(kMerges));
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes += static_cast<char>(b);
  const std::vector<std::string> texts = {
      "The quick brown fox jumps over the lazy dog.",
      "na\xc3\xafve caf\xc3\xa9 \xe2\x80\x94 \xe6\x9d\xb1\xe4\xba\xac \xf0\x9f\x99\x82",
      std::string("ctl \x01\x02\x1b[0m\x7f\0 end", 18),
      "a  \n\n b   ",
      "  \t\r\n  trailing   ",
      "it's we're they've I'll she'd I'm",
      "<|endoftext|>text<|endoftext|> more<|endoftext|",
      all_bytes,
  };
  for (const std::string& t : texts) {
    const std::vector<int32_t> ids = tok.encode(t);
    REQUIRE(tok.decode(ids) == t);
    std::string streamed;  // decode_one, id by id, gives the same bytes
    for (int32_t id : ids) streamed += tok.decode_one(id);
    REQUIRE(streamed == t);
  }
  // Random byte strings: mostly invalid UTF-8.
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    std::string t(rng() % 40, '\0');
    for (char& c : t) c = static_cast<char>(rng() % 256);
    REQUIRE(tok.decode(tok.encode(t)) == t);
  }
  // One character over several ids: each id gives its bytes.
  REQUIRE(tok.encode("\xf0\x9f\x99\x82") == bytes_of("\xf0\x9f\x99\x82"));
  REQUIRE(tok.decode_one(0xf0) == "\xf0");
  // Unknown ids decode to nothing, as in HF.
  REQUIRE(tok.decode({-1, 'a', 100000, 'b'}) == "ab");
}

TEST_CASE("tokenizer: accepted variants") {
  const json base = make_tokenizer(kMerges);
  const std::string text = "it's the thing <|endoftext|>\n\n  caf\xc3\xa9  ";
  const std::vector<int32_t> want = parse(base).encode(text);

  SECTION("merges as \"a b\" strings, with a #version line") {
    json j = base;
    json legacy = json::array({"#version: 0.2"});
    for (const auto& m : j["model"]["merges"])
      legacy.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    j["model"]["merges"] = legacy;
    REQUIRE(parse(j).encode(text) == want);
  }
  SECTION("ByteLevel inside a Sequence, no post-processor, no model type") {
    json j = base;
    j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {base["pre_tokenizer"]}}};
    j["decoder"] = {{"type", "Sequence"}, {"decoders", {base["decoder"]}}};
    j["post_processor"] = nullptr;
    j["model"].erase("type");
    REQUIRE(parse(j).encode(text) == want);
  }
  SECTION("add_prefix_space: each piece between added tokens gets one") {
    json j = base;
    j["pre_tokenizer"]["add_prefix_space"] = true;
    const BpeTokenizer tok = parse(j);
    REQUIRE(tok.encode("the") == std::vector<int32_t>{258});
    REQUIRE(tok.encode(" the") == std::vector<int32_t>{258});
    REQUIRE(tok.encode("<|endoftext|>the") == std::vector<int32_t>{266, 258});
  }
  SECTION("use_regex false: the whole text is one piece") {
    json j = base;
    j["pre_tokenizer"]["use_regex"] = false;
    REQUIRE(parse(j).encode("it's") == std::vector<int32_t>{'i', 't', 261});
    REQUIRE(parse(j).encode("a\n ") == std::vector<int32_t>{'a', 263});
  }
  SECTION("ignore_merges: a piece that is a token is taken whole") {
    json j = make_tokenizer({{"a", "b"}, {"b", "c"}, {"a", "bc"}});  // ab 256, bc 257, abc 258
    REQUIRE(parse(j).encode("abc") == std::vector<int32_t>{256, 'c'});
    j["model"]["ignore_merges"] = true;
    REQUIRE(parse(j).encode("abc") == std::vector<int32_t>{258});
  }
  SECTION("added tokens: lstrip/rstrip, normalized ones after raw ones, ids as HF gives them") {
    json j = make_tokenizer(kMerges, {});
    const auto add = [&](const std::string& content, int id, bool special, bool normalized,
                         bool strip) {
      j["added_tokens"].push_back({{"id", id},
                                   {"content", content},
                                   {"single_word", false},
                                   {"lstrip", strip},
                                   {"rstrip", strip},
                                   {"normalized", normalized},
                                   {"special", special}});
    };
    add("<mask>", 266, true, false, true);
    add("ab", 267, false, false, false);
    add("abc", 268, false, true, false);
    add("he", 257, false, true, false);  // in the vocabulary: its id there
    add("<my token>", 269, true, false, false);
    const BpeTokenizer tok = parse(j);
    REQUIRE(tok.vocab_size() == 270);
    REQUIRE(tok.encode("x <mask>  y") == std::vector<int32_t>{'x', 266, 'y'});
    // "ab" (normalized: false) is cut out first, so "abc" never matches.
    REQUIRE(tok.encode("abc") == std::vector<int32_t>{267, 'c'});
    REQUIRE(tok.encode(" the") == std::vector<int32_t>{256, 257});  // "he" cut out of " the"
    REQUIRE(tok.decode({269, 266}) == "<my token><mask>");          // not byte symbols: as written
  }
  SECTION("a byte missing from the vocabulary: dropped, or unk_token") {
    json j = base;
    j["added_tokens"] = json::array();
    j["model"]["vocab"].erase(sym('z'));
    REQUIRE(parse(j).encode("azzb") == std::vector<int32_t>{'a', 'b'});
    j["model"]["unk_token"] = "<unk>";
    REQUIRE_THROWS_WITH(parse(j).encode("z"), ContainsSubstring("unk_token '<unk>' is not in"));
    j["model"]["vocab"]["<unk>"] = 266;
    REQUIRE(parse(j).encode("azzb") == std::vector<int32_t>{'a', 266, 266, 'b'});
    j["model"]["fuse_unk"] = true;
    REQUIRE(parse(j).encode("azzb") == std::vector<int32_t>{'a', 266, 'b'});
  }
}

TEST_CASE("tokenizer: load reads a file and names it in refusals") {
  TempDir dir("tokenizer_test");
  write_bytes(dir.file("tokenizer.json"), make_tokenizer(kMerges).dump());
  REQUIRE(BpeTokenizer::load(dir.file("tokenizer.json")).encode(" the") ==
          std::vector<int32_t>{258});
  REQUIRE_THROWS_WITH(
      BpeTokenizer::load(dir.file("missing.json")),
      ContainsSubstring("cannot read tokenizer") && ContainsSubstring("missing.json"));
  write_bytes(dir.file("bad.json"), "{\"model\": ");
  REQUIRE_THROWS_WITH(BpeTokenizer::load(dir.file("bad.json")),
                      ContainsSubstring("bad.json' is not JSON"));
  REQUIRE_THROWS_WITH(BpeTokenizer::load(dir.path), ContainsSubstring("cannot read"));
}

TEST_CASE("tokenizer: refusals say what is wrong") {
  const json base = make_tokenizer(kMerges);
  const auto with = [&](const json::json_pointer& at, const json& value) {
    json j = base;
    j[at] = value;
    return refusal(j);
  };
  using P = json::json_pointer;
  const auto has = [](const std::string& message, const std::string& part) {
    INFO(message);
    REQUIRE(message.rfind("tokenizer 'test.json'", 0) == 0);
    REQUIRE(message.find(part) != std::string::npos);
  };
  REQUIRE(refusal(base) == "");
  has(refusal(json::array({1, 2})), "not a JSON object");
  has(with(P("/model/type"), "WordPiece"), "model type is WordPiece, not BPE");
  has(with(P("/normalizer"), {{"type", "NFC"}}), "normalizer NFC is not supported");
  has(with(P("/pre_tokenizer"), {{"type", "Whitespace"}}),
      "pre_tokenizer Whitespace is not byte-level");
  has(with(P("/pre_tokenizer"), nullptr), "pre_tokenizer null is not byte-level");
  has(with(P("/pre_tokenizer"),
           {{"type", "Sequence"},
            {"pretokenizers", json::array({{{"type", "Split"}}, base["pre_tokenizer"]})}}),
      "pre_tokenizer Sequence [Split, ByteLevel] is not byte-level");
  has(with(P("/decoder"), {{"type", "WordPiece"}}), "decoder WordPiece is not byte-level");
  has(with(P("/post_processor"), {{"type", "TemplateProcessing"}}),
      "post_processor TemplateProcessing is not supported");
  has(with(P("/model/dropout"), 0.1), "dropout 0.1");
  has(with(P("/model/continuing_subword_prefix"), "##"), "continuing_subword_prefix");
  has(with(P("/model/vocab"), json::array()), "model.vocab is not an object");
  has(with(P("/model/vocab/a"), -3), "token \"a\" has id -3");
  has(with(P("/model/merges"), json::parse(R"(["a b c"])")), "merge 0 \"a b c\" is not two tokens");
  has(with(P("/model/merges"), json::parse(R"([["a"]])")),
      "merge 0 [\"a\"] is neither \"a b\" nor [\"a\", \"b\"]");
  has(with(P("/model/merges"), json::parse(R"([["x", "y"]])")),
      "merge 0 [\"x\",\"y\"]: \"xy\" is not in the vocabulary");
  has(with(P("/added_tokens/0/id"), 999), "would give it 266");
  has(with(P("/added_tokens/0/single_word"), true), "single_word: not supported");
  has(with(P("/model/vocab/" + sym('a')), "x"), "token \"a\" has id \"x\"");
}
