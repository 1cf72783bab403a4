// The one piece of global state: the logger, which prefixes lines with the rank.
#pragma once

#include <spdlog/spdlog.h>

namespace trainer {

// Configures spdlog for this process ("[rank 1/4]" prefixes when world > 1).
void init_logging(int rank, int world);
int log_rank();

}  // namespace trainer
