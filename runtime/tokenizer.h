// A GPT-2-style byte-level BPE tokenizer read from a Hugging Face `tokenizer.json`, encoding
// exactly as the `tokenizers` library does (checked by tests/tokenizer_hf_check.py):
//
//   1. added tokens (`added_tokens`, e.g. <|endoftext|>) are cut out of the text where it spells
//      them, leftmost-longest, first those with "normalized": false, then the others (with no
//      normalizer both match the raw text), honouring lstrip / rstrip; each becomes its id;
//   2. the rest is split by GPT-2's regex
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      (by hand over code points, Unicode 16.0 classes as tokenizers' Oniguruma has them);
//   3. each piece's bytes become GPT-2's byte symbols and are merged by BPE, lowest merge rank
//      first (leftmost on ties), with a per-piece cache.
//
// Accepted: model BPE (merges as "a b" strings or ["a", "b"] pairs; no dropout, no subword
// prefix or suffix; ignore_merges honoured), normalizer null, pre-tokenizer ByteLevel (alone or
// the only member of a Sequence; add_prefix_space and use_regex honoured), decoder ByteLevel,
// post-processor null or ByteLevel (which adds no ids). `truncation` and `padding` are ignored.
// Anything else is refused by load() with a UsageError naming the file and the field, as are
// single_word added tokens and added-token ids other than those HF would assign on loading.
// With add_prefix_space the added space stays in decode(), as in HF.
//
// Bytes that are not valid UTF-8 (which a Python str cannot hold, so HF never sees them) count
// as one "other" code point each, i.e. like punctuation: every byte string encodes, and decodes
// back to the same bytes.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace trainer {

class BpeTokenizer {
 public:
  // Reads and checks `path`; UsageError (naming the file and what is wrong) on any problem.
  static BpeTokenizer load(const std::string& path);
  // The same from the text of a tokenizer.json; `name` stands for the file in messages.
  static BpeTokenizer parse(std::string_view json_text, const std::string& name);

  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;
  ~BpeTokenizer();

  // The ids HF's Tokenizer.encode(text).ids gives (thread-safe).
  std::vector<int32_t> encode(std::string_view text) const;
  // The bytes of the ids, added tokens included (HF: decode(ids, skip_special_tokens=False),
  // without its replacement of invalid UTF-8 by U+FFFD). Unknown ids decode to nothing, as in HF.
  std::string decode(const std::vector<int32_t>& ids) const;
  // The bytes of one more id, for streaming: decode(ids) is the concatenation of decode_one over
  // ids, so a character may be split across ids; print bytes, not characters.
  std::string decode_one(int32_t id) const;

  // Max id + 1 over the vocabulary and the added tokens.
  int32_t vocab_size() const { return static_cast<int32_t>(id_bytes_.size()); }
  // The id of a token string as the file spells it (added tokens first, as HF does).
  std::optional<int32_t> token_id(std::string_view token) const;

  // The pieces GPT-2's regex cuts `text` into (step 2 above; for tests and tools).
  static std::vector<std::string> split_pieces(std::string_view text);

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using TokenMap = std::unordered_map<std::string, int32_t, Hash, std::equal_to<>>;
  struct AddedToken {
    std::string content;
    int32_t id;
    bool lstrip, rstrip;
  };
  struct Merge {
    int32_t rank, id;
  };
  struct Segment {
    size_t begin, end;
    int32_t id;  // an added token's id, or -1 for text still to split
  };
  struct Cache;

  BpeTokenizer();
  void split_added(std::string_view text, const std::vector<AddedToken>& tokens,
                   std::vector<Segment>& segments) const;
  void encode_text(std::string_view text, std::vector<int32_t>& out) const;
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;

  TokenMap vocab_;  // model vocabulary: token (in byte symbols) -> id
  TokenMap added_ids_;
  std::vector<AddedToken> added_raw_;           // "normalized": false, matched first
  std::vector<AddedToken> added_normalized_;    // "normalized": true
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> rank, new id
  std::array<int32_t, 256> byte_ids_{};         // id of each byte's symbol, -1 when not in vocab
  std::optional<int32_t> unk_id_;
  std::string unk_token_;  // named by the model, maybe absent from the vocabulary
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  bool add_prefix_space_ = false;
  bool use_regex_ = true;
  std::string name_;
  std::vector<std::string> id_bytes_;  // decoded bytes per id
  std::vector<bool> id_known_;
  std::unique_ptr<Cache> cache_;
};

}  // namespace trainer
