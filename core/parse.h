// Strict parsing of the non-negative integers users and files hand us (seeds, steps, step_N).
#pragma once

#include <charconv>
#include <cstdint>
#include <optional>
#include <string_view>

namespace trainer {

// `text` as a decimal integer in [0, max]: digits only (no sign, space or leading '+'), else
// nullopt.
inline std::optional<uint64_t> parse_decimal(std::string_view text, uint64_t max) {
  uint64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || text.front() == '-' || ec != std::errc() || ptr != end || v > max)
    return std::nullopt;
  return v;
}

}  // namespace trainer
