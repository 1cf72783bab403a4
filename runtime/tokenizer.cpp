// Byte-level BPE from a Hugging Face tokenizer.json; the header says what is matched and how.
#include "runtime/tokenizer.h"

#include <errno.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>

#include "core/error.h"

namespace trainer {

namespace {

using json = nlohmann::json;

// ---- Unicode classes of the pre-tokenization regex -------------------------------------------

enum CodePointClass : uint8_t { kOther, kLetter, kNumber, kSpace };

struct CodePointRange {
  uint32_t first, last;
  CodePointClass cls;
};

#include "runtime/unicode_tables.inc"

constexpr uint32_t kInvalidByte = 0x110000;  // stands for one byte that is not valid UTF-8

CodePointClass classify(uint32_t cp) {
  if (cp < 0x80) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return kLetter;
    if (cp >= '0' && cp <= '9') return kNumber;
    if (cp == ' ' || (cp >= 0x9 && cp <= 0xD)) return kSpace;
    return kOther;
  }
  const auto* end = std::end(kCodePointRanges);
  const auto* it =
      std::upper_bound(std::begin(kCodePointRanges), end, cp,
                       [](uint32_t c, const CodePointRange& r) { return c < r.first; });
  if (it == std::begin(kCodePointRanges)) return kOther;
  --it;
  return cp <= it->last ? it->cls : kOther;
}

// Decodes the code point at s[i] (strict UTF-8: no overlong forms, surrogates or values past
// U+10FFFF); returns its length, or 1 with cp = kInvalidByte for a byte that starts none.
size_t next_code_point(std::string_view s, size_t i, uint32_t& cp) {
  const auto at = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t b0 = at(i);
  const auto cont = [&](size_t k, uint8_t lo = 0x80, uint8_t hi = 0xBF) {
    return i + k < s.size() && at(i + k) >= lo && at(i + k) <= hi;
  };
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  }
  if (b0 >= 0xC2 && b0 <= 0xDF && cont(1)) {
    cp = (b0 & 0x1Fu) << 6 | (at(i + 1) & 0x3Fu);
    return 2;
  }
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    const uint8_t lo = b0 == 0xE0 ? 0xA0 : 0x80, hi = b0 == 0xED ? 0x9F : 0xBF;
    if (cont(1, lo, hi) && cont(2)) {
      cp = (b0 & 0x0Fu) << 12 | (at(i + 1) & 0x3Fu) << 6 | (at(i + 2) & 0x3Fu);
      return 3;
    }
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    const uint8_t lo = b0 == 0xF0 ? 0x90 : 0x80, hi = b0 == 0xF4 ? 0x8F : 0xBF;
    if (cont(1, lo, hi) && cont(2) && cont(3)) {
      cp = (b0 & 0x07u) << 18 | (at(i + 1) & 0x3Fu) << 12 | (at(i + 2) & 0x3Fu) << 6 |
           (at(i + 3) & 0x3Fu);
      return 4;
    }
  }
  cp = kInvalidByte;
  return 1;
}

bool is_white_space(uint32_t cp) { return classify(cp) == kSpace; }

// ---- GPT-2's byte <-> symbol mapping ------------------------------------------------------

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | cp >> 6);
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {  // the byte symbols stay below U+0144
    s += static_cast<char>(0xE0 | cp >> 12);
    s += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// Printable Latin-1 bytes stand for themselves; the other 68 take U+0100.. in byte order.
struct ByteSymbols {
  std::array<uint32_t, 256> code_point{};
  std::array<std::string, 256> text;  // UTF-8 of code_point
  std::array<int16_t, 324> byte_of;   // inverse, -1 where no byte maps
  ByteSymbols() {
    byte_of.fill(-1);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      code_point[b] = printable ? b : next++;
      text[b] = utf8(code_point[b]);
      byte_of[code_point[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteSymbols& byte_symbols() {
  static const ByteSymbols s;
  return s;
}

std::string to_symbols(std::string_view bytes) {
  const auto& bs = byte_symbols();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += bs.text[static_cast<uint8_t>(c)];
  return out;
}

// HF's ByteLevel decoder on one token: its symbols' bytes, or, when any character is not a byte
// symbol (e.g. an added token with a space), the token's own UTF-8.
std::string token_bytes(std::string_view token) {
  const auto& bs = byte_symbols();
  std::string out;
  for (size_t i = 0; i < token.size();) {
    uint32_t cp;
    i += next_code_point(token, i, cp);
    if (cp >= bs.byte_of.size() || bs.byte_of[cp] < 0) return std::string(token);
    out += static_cast<char>(bs.byte_of[cp]);
  }
  return out;
}

// GPT-2's pre-tokenization regex, alternative by alternative over code points; calls emit with
// each piece in order (the pieces cover the text).
struct Cp {
  uint32_t cp;
  size_t begin;  // byte offset in the text
  CodePointClass cls;
};

template <typename Emit>
void for_each_piece(std::string_view text, Emit&& emit) {
  std::vector<Cp> cps;
  cps.reserve(text.size() + 1);
  for (size_t i = 0; i < text.size();) {
    uint32_t cp;
    const size_t n = next_code_point(text, i, cp);
    cps.push_back({cp, i, cp == kInvalidByte ? kOther : classify(cp)});
    i += n;
  }
  const size_t n = cps.size();
  cps.push_back({0, text.size(), kOther});  // end sentinel
  const auto run = [&](size_t i, CodePointClass cls) {
    while (i < n && cps[i].cls == cls) ++i;
    return i;
  };
  for (size_t i = 0; i < n;) {
    size_t j;
    const uint32_t c = cps[i].cp, c1 = i + 1 < n ? cps[i + 1].cp : 0,
                   c2 = i + 2 < n ? cps[i + 2].cp : 0;
    if (c == '\'' && (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd')) {
      j = i + 2;  // 's|'t|'m|'d
    } else if (c == '\'' &&
               ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l'))) {
      j = i + 3;  // 're|'ve|'ll
    } else if (c == ' ' && i + 1 < n && cps[i + 1].cls != kSpace) {
      j = run(i + 1, cps[i + 1].cls);  // " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+"
    } else if (cps[i].cls != kSpace) {
      j = run(i, cps[i].cls);  // the same without the space
    } else {
      // \s+(?!\S) takes the run but its last character when a non-space follows; \s+ takes a
      // run of one followed by a non-space.
      j = run(i, kSpace);
      if (j < n && j - 1 > i) --j;
    }
    emit(text.substr(cps[i].begin, cps[j].begin - cps[i].begin));
    i = j;
  }
}

// ---- loading -------------------------------------------------------------------------------

std::string type_of(const json& j) {
  if (j.is_object() && j.contains("type") && j["type"].is_string()) return j["type"];
  return j.is_null() ? "null" : j.dump().substr(0, 60);
}

// A component that must be ByteLevel, alone or as the only member of a Sequence.
const json* byte_level(const json& j, const char* members) {
  if (type_of(j) == "ByteLevel") return &j;
  if (type_of(j) == "Sequence" && j.contains(members) && j[members].is_array() &&
      j[members].size() == 1 && type_of(j[members][0]) == "ByteLevel")
    return &j[members][0];
  return nullptr;
}

std::string describe(const json& j) {
  std::string t = type_of(j);
  if (type_of(j) == "Sequence") {
    for (const char* key : {"pretokenizers", "decoders", "processors", "normalizers"}) {
      if (!j.contains(key) || !j[key].is_array()) continue;
      t += " [";
      for (size_t i = 0; i < j[key].size(); ++i) t += (i ? ", " : "") + type_of(j[key][i]);
      t += "]";
    }
  }
  return t;
}

[[noreturn]] void refuse(const std::string& name, const std::string& what) {
  usage_error("tokenizer '{}': {}", name, what);
}

}  // namespace

struct BpeTokenizer::Cache {
  static constexpr size_t kMaxEntries = 1 << 16;  // cleared when full: bounded memory
  static constexpr size_t kMaxWordBytes = 256;    // longer pieces are rare and not cached
  std::mutex mutex;
  std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> words;
};

BpeTokenizer::BpeTokenizer() : cache_(std::make_unique<Cache>()) {}
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;
BpeTokenizer::~BpeTokenizer() = default;

BpeTokenizer BpeTokenizer::load(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    usage_error("cannot read tokenizer '{}': it is a directory", path);
  std::ifstream f(path, std::ios::binary);
  if (!f) usage_error("cannot read tokenizer '{}': {}", path, std::strerror(errno));
  const std::string text{std::istreambuf_iterator<char>(f), {}};
  if (f.bad()) usage_error("cannot read tokenizer '{}': {}", path, std::strerror(errno));
  return parse(text, path);
}

BpeTokenizer BpeTokenizer::parse(std::string_view json_text, const std::string& name) {
  json doc;
  try {
    doc = json::parse(json_text);
  } catch (const json::exception& e) {
    usage_error("tokenizer '{}' is not JSON: {}", name, e.what());
  }
  if (!doc.is_object()) usage_error("tokenizer '{}': not a JSON object", name);
  const auto fail = [&](const std::string& what) { refuse(name, what); };
  const auto field = [&](const json& obj, const char* key) -> const json& {
    static const json null;
    return obj.is_object() && obj.contains(key) ? obj[key] : null;
  };
  BpeTokenizer t;
  t.name_ = name;
  try {
    // Stages around the model: only the byte-level ones are implemented.
    if (!field(doc, "normalizer").is_null())
      fail("normalizer " + describe(doc["normalizer"]) +
           " is not supported (only null: no normalizer)");
    const json* pre = byte_level(field(doc, "pre_tokenizer"), "pretokenizers");
    if (!pre)
      fail("pre_tokenizer " + describe(field(doc, "pre_tokenizer")) +
           " is not byte-level (expected ByteLevel)");
    // Missing fields take the values of HF's ByteLevel::default().
    t.add_prefix_space_ = field(*pre, "add_prefix_space").is_null()
                              ? true
                              : field(*pre, "add_prefix_space").get<bool>();
    t.use_regex_ = field(*pre, "use_regex").is_null() ? true : field(*pre, "use_regex").get<bool>();
    if (!byte_level(field(doc, "decoder"), "decoders"))
      fail("decoder " + describe(field(doc, "decoder")) +
           " is not byte-level (expected ByteLevel)");
    const json& post = field(doc, "post_processor");
    if (!post.is_null() && !byte_level(post, "processors"))
      fail("post_processor " + describe(post) +
           " is not supported (it would add ids; only null or ByteLevel)");

    // The model.
    const json& model = field(doc, "model");
    if (!model.is_object()) fail("no \"model\" object");
    const std::string type = field(model, "type").is_null() && model.contains("merges")
                                 ? std::string("BPE")
                                 : type_of(model);
    if (type != "BPE") fail("model type is " + type + ", not BPE");
    const json& dropout = field(model, "dropout");
    if (!dropout.is_null() && dropout.get<double>() != 0.0)
      fail("BPE dropout " + dropout.dump() + " is random at encode time: not supported");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      const json& v = field(model, key);
      if (!v.is_null() && !v.get<std::string>().empty())
        fail(std::string("model.") + key + " " + v.dump() + " is not supported by byte-level BPE");
    }
    t.fuse_unk_ = field(model, "fuse_unk").is_boolean() && model["fuse_unk"].get<bool>();
    t.ignore_merges_ =
        field(model, "ignore_merges").is_boolean() && model["ignore_merges"].get<bool>();
    if (field(model, "unk_token").is_string()) t.unk_token_ = model["unk_token"];

    const json& vocab = field(model, "vocab");
    if (!vocab.is_object()) fail("model.vocab is not an object of token -> id");
    constexpr int64_t kMaxId = (int64_t{1} << 24) - 1;  // bounds the per-id decode table
    int64_t max_id = -1;
    const auto check_id = [&](const json& id, const std::string& token) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > kMaxId)
        fail("token " + json(token).dump() + " has id " + id.dump() + " (expected 0.." +
             std::to_string(kMaxId) + ")");
      max_id = std::max(max_id, id.get<int64_t>());
      return static_cast<int32_t>(id.get<int64_t>());
    };
    for (const auto& [token, id] : vocab.items()) t.vocab_[token] = check_id(id, token);
    const auto& bs = byte_symbols();
    bool all_bytes = true;
    for (int b = 0; b < 256; ++b) {
      const auto it = t.vocab_.find(bs.text[b]);
      t.byte_ids_[b] = it == t.vocab_.end() ? -1 : it->second;
      all_bytes = all_bytes && it != t.vocab_.end();
    }
    if (!t.unk_token_.empty()) {
      const auto it = t.vocab_.find(t.unk_token_);
      if (it != t.vocab_.end()) t.unk_id_ = it->second;
    }
    if (field(model, "byte_fallback").is_boolean() && model["byte_fallback"].get<bool>() &&
        !all_bytes)
      fail("model.byte_fallback with byte symbols missing from the vocabulary: not supported");

    // Merges, "a b" (tokenizers < 0.20) or ["a", "b"]; a later duplicate wins, as in HF.
    const json& merges = field(model, "merges");
    if (!merges.is_array()) fail("model.merges is not an array");
    int32_t rank = 0;
    for (size_t i = 0; i < merges.size(); ++i) {
      const json& m = merges[i];
      std::string a, b;
      if (m.is_string()) {
        const std::string s = m;
        if (s.rfind("#version", 0) == 0) continue;
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          fail("merge " + std::to_string(i) + " " + m.dump() + " is not two tokens \"a b\"");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        a = m[0];
        b = m[1];
      } else {
        fail("merge " + std::to_string(i) + " " + m.dump().substr(0, 60) +
             " is neither \"a b\" nor [\"a\", \"b\"]");
      }
      int32_t ids[3];
      const std::string parts[3] = {a, b, a + b};
      for (int k = 0; k < 3; ++k) {
        const auto it = t.vocab_.find(parts[k]);
        if (it == t.vocab_.end())
          fail("merge " + std::to_string(i) + " " + m.dump() + ": " + json(parts[k]).dump() +
               " is not in the vocabulary");
        ids[k] = it->second;
      }
      t.merges_[uint64_t(uint32_t(ids[0])) << 32 | uint32_t(ids[1])] = {rank++, ids[2]};
    }

    // Added tokens get the ids HF's AddedVocabulary gives them (the model's id for a token of
    // the vocabulary, else the next free one); a file whose ids differ is refused.
    const json& added = field(doc, "added_tokens");
    if (!added.is_null() && !added.is_array()) fail("added_tokens is not an array");
    int64_t max_added = -1;
    for (const json& a : added.is_array() ? added : json::array()) {
      if (!a.is_object() || !field(a, "content").is_string())
        fail("added token " + a.dump().substr(0, 60) + " has no content");
      const std::string content = a["content"];
      if (content.empty()) continue;  // HF ignores these
      if (t.added_ids_.count(content)) fail("added token " + a["content"].dump() + " twice");
      const auto flag = [&](const char* key, bool dflt) {
        return field(a, key).is_boolean() ? a[key].get<bool>() : dflt;
      };
      const bool special = flag("special", false);
      if (flag("single_word", false))
        fail("added token " + a["content"].dump() + " has single_word: not supported");
      int64_t id;
      const auto in_vocab = t.vocab_.find(content);
      const int64_t model_size = static_cast<int64_t>(t.vocab_.size());
      if (in_vocab != t.vocab_.end())
        id = in_vocab->second;
      else if (max_added < 0)
        id = model_size;
      else
        id = max_added >= model_size || model_size == 0 ? max_added + 1 : model_size;
      if (field(a, "id") != json(id))
        fail("added token " + a["content"].dump() + " has id " + field(a, "id").dump() +
             " but Hugging Face tokenizers would give it " + std::to_string(id));
      check_id(a["id"], content);
      max_added = std::max(max_added, id);
      t.added_ids_[content] = static_cast<int32_t>(id);
      // Contents are unique, so the order within a group does not change leftmost-longest.
      (flag("normalized", !special) ? t.added_normalized_ : t.added_raw_)
          .push_back(
              {content, static_cast<int32_t>(id), flag("lstrip", false), flag("rstrip", false)});
    }

    // Decoded bytes per id: added tokens shadow the model's token of the same id.
    t.id_bytes_.resize(static_cast<size_t>(max_id + 1));
    t.id_known_.assign(static_cast<size_t>(max_id + 1), false);
    for (const auto& [token, id] : t.vocab_) {
      t.id_bytes_[id] = token_bytes(token);
      t.id_known_[id] = true;
    }
    for (const auto& [token, id] : t.added_ids_) {
      t.id_bytes_[id] = token_bytes(token);
      t.id_known_[id] = true;
    }
  } catch (const json::exception& e) {
    usage_error("tokenizer '{}': {}", name, e.what());
  }
  return t;
}

std::optional<int32_t> BpeTokenizer::token_id(std::string_view token) const {
  if (const auto it = added_ids_.find(token); it != added_ids_.end()) return it->second;
  if (const auto it = vocab_.find(token); it != vocab_.end()) return it->second;
  return std::nullopt;
}

std::string BpeTokenizer::decode_one(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !id_known_[id]) return {};
  return id_bytes_[id];
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += decode_one(id);
  return out;
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<Segment> segments{{0, text.size(), -1}};
  // As HF: tokens matched on the raw text first, then those matched on the normalized text.
  split_added(text, added_raw_, segments);
  split_added(text, added_normalized_, segments);
  std::vector<int32_t> out;
  for (const Segment& s : segments) {
    if (s.id >= 0)
      out.push_back(s.id);
    else if (s.end > s.begin)  // HF drops empty pieces before pre-tokenizing
      encode_text(text.substr(s.begin, s.end - s.begin), out);
  }
  return out;
}

// HF's AddedVocabulary::find_matches on each segment still to split: non-overlapping
// leftmost-longest matches, widened over whitespace on the left (lstrip, not into the previous
// match) and on the right (rstrip).
void BpeTokenizer::split_added(std::string_view text, const std::vector<AddedToken>& tokens,
                               std::vector<Segment>& segments) const {
  if (tokens.empty()) return;
  const auto space_before = [&](size_t begin, size_t pos) {  // start of the whitespace run
    while (pos > begin) {
      size_t k = pos - 1;  // back over continuation bytes to where a code point may start
      while (k > begin && pos - k < 4 && (static_cast<uint8_t>(text[k]) & 0xC0) == 0x80) --k;
      uint32_t cp;
      if (k + next_code_point(text, k, cp) != pos || !is_white_space(cp)) break;
      pos = k;
    }
    return pos;
  };
  const auto space_after = [&](size_t pos, size_t end) {
    while (pos < end) {
      uint32_t cp;
      const size_t n = next_code_point(text.substr(0, end), pos, cp);
      if (!is_white_space(cp)) break;
      pos += n;
    }
    return pos;
  };
  std::array<bool, 256> first_byte{};  // skips most positions without comparing
  for (const AddedToken& t : tokens) first_byte[static_cast<uint8_t>(t.content[0])] = true;
  std::vector<Segment> out;
  for (const Segment& seg : segments) {
    if (seg.id >= 0) {
      out.push_back(seg);
      continue;
    }
    size_t offset = seg.begin;  // start of the text not yet in `out`
    for (size_t pos = seg.begin; pos < seg.end;) {
      const AddedToken* best = nullptr;
      if (first_byte[static_cast<uint8_t>(text[pos])])
        for (const AddedToken& t : tokens) {
          if (t.content.size() <= seg.end - pos &&
              (!best || t.content.size() > best->content.size()) &&
              text.compare(pos, t.content.size(), t.content) == 0)
            best = &t;
        }
      if (!best) {
        ++pos;
        continue;
      }
      size_t start = pos, stop = pos + best->content.size();
      pos = stop;  // the next match starts after this one, before any widening
      if (best->lstrip) start = std::max(space_before(seg.begin, start), offset);
      if (best->rstrip) stop = space_after(stop, seg.end);
      if (offset < start) out.push_back({offset, start, -1});
      out.push_back({start, stop, best->id});
      offset = stop;
    }
    if (offset < seg.end) out.push_back({offset, seg.end, -1});
  }
  segments = std::move(out);
}

// A piece of text between added tokens: byte-level pre-tokenization, then BPE on each piece.
void BpeTokenizer::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  std::string prefixed;
  if (add_prefix_space_ && text.front() != ' ') {
    prefixed = " " + std::string(text);
    text = prefixed;
  }
  if (!use_regex_) {
    encode_word(text, out);
    return;
  }
  for_each_piece(text, [&](std::string_view piece) { encode_word(piece, out); });
}

std::vector<std::string> BpeTokenizer::split_pieces(std::string_view text) {
  std::vector<std::string> pieces;
  for_each_piece(text, [&](std::string_view piece) { pieces.emplace_back(piece); });
  return pieces;
}

void BpeTokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (ignore_merges_) {  // HF takes a piece that is a token as it is
    if (const auto it = vocab_.find(to_symbols(word)); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= Cache::kMaxWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_->mutex);
    if (const auto it = cache_->words.find(word); it != cache_->words.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  merge_word(word, out);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_->mutex);
    if (cache_->words.size() >= Cache::kMaxEntries) cache_->words.clear();
    cache_->words.emplace(word, std::vector<int32_t>(out.begin() + first, out.end()));
  }
}

// HF's Word::merge_all: a min-heap of (rank, position) over adjacent pairs; entries made stale
// by an earlier merge are skipped when popped.
void BpeTokenizer::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // -1 at the ends
    bool gone;
  };
  std::vector<Symbol> syms;
  syms.reserve(word.size());
  const auto push = [&](int32_t id) {
    const int32_t k = static_cast<int32_t>(syms.size());
    if (k > 0) syms.back().next = k;
    syms.push_back({id, k - 1, -1, false});
  };
  // A byte whose symbol is not in the vocabulary becomes unk_token (consecutive ones fused when
  // fuse_unk) or, with no unk_token, is dropped: what HF's BPE::merge_word does.
  bool pending_unk = false;
  for (char ch : word) {
    const int32_t id = byte_ids_[static_cast<uint8_t>(ch)];
    if (id >= 0) {
      if (pending_unk) push(*unk_id_), pending_unk = false;
      push(id);
    } else if (!unk_token_.empty()) {
      if (!unk_id_)
        usage_error(
            "tokenizer '{}': byte {:#04x} has no symbol in the vocabulary and unk_token "
            "'{}' is not in it either",
            name_, static_cast<uint8_t>(ch), unk_token_);
      if (pending_unk && !fuse_unk_) push(*unk_id_);
      pending_unk = true;
    }
  }
  if (pending_unk) push(*unk_id_);

  struct Candidate {
    int32_t rank, pos, id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  const auto consider = [&](int32_t pos) {
    const int32_t next = syms[pos].next;
    if (next < 0) return;
    const auto it = merges_.find(uint64_t(uint32_t(syms[pos].id)) << 32 | uint32_t(syms[next].id));
    if (it != merges_.end()) queue.push({it->second.rank, pos, it->second.id});
  };
  for (int32_t k = 0; k + 1 < static_cast<int32_t>(syms.size()); ++k) consider(k);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = syms[top.pos];
    if (left.gone || left.next < 0) continue;
    const int32_t right = left.next;
    const auto it = merges_.find(uint64_t(uint32_t(left.id)) << 32 | uint32_t(syms[right].id));
    if (it == merges_.end() || it->second.id != top.id) continue;  // stale
    left.id = top.id;
    left.next = syms[right].next;
    syms[right].gone = true;
    if (left.next >= 0) syms[left.next].prev = top.pos;
    if (left.prev >= 0) consider(left.prev);
    consider(top.pos);
  }
  for (const Symbol& s : syms)
    if (!s.gone) out.push_back(s.id);
}

}  // namespace trainer
