// The main() of the small command-line tools beside the trainer: parse the command line with
// CLI11, run the tool, and turn its errors into one line and an exit code (0 success, 1 internal
// error, 2 bad usage or unreadable files; a tool's own result codes come from `body`).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "core/error.h"

namespace trainer {

template <typename Body>
int tool_main(const char* name, CLI::App& app, int argc, char** argv, Body&& body) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  try {
    return body();
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: error: %s\n", name, e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: internal error: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace trainer
