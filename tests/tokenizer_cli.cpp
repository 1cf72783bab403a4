// tokenizer_cli: runtime/tokenizer.h from the command line, for tests/tokenizer_hf_check.py.
//
//   tokenizer_cli TOKENIZER_JSON encode   stdin: records "LEN\n" + LEN bytes; stdout: one line of
//                                         space-separated ids per record
//   tokenizer_cli TOKENIZER_JSON decode   stdin: one line of ids per record; stdout: records
//                                         "LEN\n" + the decoded bytes
//   tokenizer_cli TOKENIZER_JSON pieces   stdin: text; stdout: the byte length of each piece of
//                                         GPT-2's pre-tokenization regex, one per line
//
// Records let one process handle many strings, newlines and NULs included.
// Exit codes: 0 done, 2 bad usage or tokenizer file (one line on stderr).
#include <cstdio>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/tokenizer.h"

int main(int argc, char** argv) {
  using trainer::BpeTokenizer;
  std::ios::sync_with_stdio(false);
  const std::string mode = argc == 3 ? argv[2] : "";
  if (mode != "encode" && mode != "decode" && mode != "pieces") {
    std::cerr << "usage: tokenizer_cli TOKENIZER_JSON encode|decode|pieces\n";
    return 2;
  }
  try {
    const BpeTokenizer tok = BpeTokenizer::load(argv[1]);
    std::string out;
    if (mode == "encode") {
      size_t len;
      while (std::cin >> len) {
        std::cin.get();  // the newline after the length
        std::string text(len, '\0');
        std::cin.read(text.data(), static_cast<std::streamsize>(len));
        const std::vector<int32_t> ids = tok.encode(text);
        for (size_t i = 0; i < ids.size(); ++i) {
          if (i) out += ' ';
          out += std::to_string(ids[i]);
        }
        out += '\n';
      }
    } else if (mode == "decode") {
      for (std::string line; std::getline(std::cin, line);) {
        std::istringstream in(line);
        std::vector<int32_t> ids{std::istream_iterator<int32_t>(in), {}};
        const std::string text = tok.decode(ids);
        out += std::to_string(text.size()) + "\n" + text;
      }
    } else {
      const std::string text{std::istreambuf_iterator<char>(std::cin), {}};
      for (const std::string& piece : BpeTokenizer::split_pieces(text))
        out += std::to_string(piece.size()) + "\n";
    }
    std::cout << out << std::flush;
    return std::cout.good() ? 0 : 1;
  } catch (const trainer::UsageError& e) {
    std::cerr << "tokenizer_cli: " << e.what() << "\n";
    return 2;
  }
}
