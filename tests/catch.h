// Hides the difference between Catch2 v2 (Debian 12) and v3 (Ubuntu 24.04).
#pragma once

#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#else
#include <catch2/catch.hpp>
#endif

using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;

// Substring matcher for REQUIRE_THROWS_WITH: v3 calls it ContainsSubstring, v2 Contains.
#if __has_include(<catch2/catch_all.hpp>)
using Catch::Matchers::ContainsSubstring;
#else
inline auto ContainsSubstring(const std::string& s) { return Catch::Matchers::Contains(s); }
#endif
