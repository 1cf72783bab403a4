#include "core/log.h"

#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>

namespace trainer {
namespace {
int g_rank = 0;
}

void init_logging(int rank, int world) {
  g_rank = rank;
  const std::string who = world > 1 ? fmt::format("[rank {}/{}] ", rank, world) : "";
  spdlog::set_pattern("[%H:%M:%S.%e] " + who + "%^%l%$ %v");
  // mpirun gives ranks a terminal even when its own output goes to a file (a Slurm job's): the
  // launch scripts set NO_COLOR (no-color.org) so that such logs hold no escape codes.
  if (const char* v = std::getenv("NO_COLOR"); v && *v)
    for (auto& sink : spdlog::default_logger()->sinks())
      if (auto* s = dynamic_cast<spdlog::sinks::stdout_color_sink_mt*>(sink.get()))
        s->set_color_mode(spdlog::color_mode::never);
}

int log_rank() { return g_rank; }

}  // namespace trainer
