// Errors shared by every library: one exception type for bad user input (exit code 2, reported
// before any compute) and one for failures at run time (exit code 1, all ranks are stopped).
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace trainer {

// Something the user can fix: a flag, a file, a checkpoint, a world size.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A UsageError that every rank raised together (after agreeing on it), so every rank can stop
// cleanly instead of aborting the others.
class AgreedUsageError : public UsageError {
 public:
  using UsageError::UsageError;
};

// A failure of the program or the system (a collective, a device call, an invariant).
class RuntimeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What to try when a run does not fit in memory (host or GPU), for the messages that say so.
inline constexpr const char* kOutOfMemoryAdvice =
    "reduce --batch (raise --grad-accum to keep the global batch), --ctx or the model, keep fewer "
    "activations with --recompute ffn or block, or spread the optimizer state over more ranks "
    "with --shard-optim";

template <typename... Args>
[[noreturn]] void usage_error(fmt::format_string<Args...> f, Args&&... args) {
  throw UsageError(fmt::format(f, std::forward<Args>(args)...));
}

template <typename... Args>
[[noreturn]] void runtime_error(fmt::format_string<Args...> f, Args&&... args) {
  throw RuntimeError(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace trainer

// Invariant check that stays on in release builds; the message names the values involved.
#define TRAINER_CHECK(cond, ...)                                                          \
  do {                                                                                    \
    if (!(cond))                                                                          \
      ::trainer::runtime_error("{}:{}: check `{}` failed: {}", __FILE__, __LINE__, #cond, \
                               ::fmt::format(__VA_ARGS__));                               \
  } while (0)
