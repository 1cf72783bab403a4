#include "core/log.h"

#include <fmt/format.h>

namespace trainer {
namespace {
int g_rank = 0;
}

void init_logging(int rank, int world) {
  g_rank = rank;
  const std::string who = world > 1 ? fmt::format("[rank {}/{}] ", rank, world) : "";
  spdlog::set_pattern("[%H:%M:%S.%e] " + who + "%^%l%$ %v");
}

int log_rank() { return g_rank; }

}  // namespace trainer
