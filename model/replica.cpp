// The replica interface's defaults: CUDA graphs exist on the CUDA backend only (options refuse
// --cuda-graph elsewhere, so reaching these is a programming error).
#include "model/replica.h"

#include "core/error.h"

namespace trainer {

namespace {
[[noreturn]] void no_graphs(const char* what) {
  runtime_error("{}: CUDA graphs need the CUDA backend", what);
}
}  // namespace

void Replica::stage(const MicroBatch&, int) { no_graphs("stage"); }
void Replica::forward_staged(int, const ParamsNeededFn&) { no_graphs("forward_staged"); }
void Replica::begin_capture() { no_graphs("begin_capture"); }
void Replica::end_capture() { no_graphs("end_capture"); }
void Replica::replay() { no_graphs("replay"); }

}  // namespace trainer
