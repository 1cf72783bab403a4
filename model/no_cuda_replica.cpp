// make_cuda_replica and make_cuda_decoder in a build without the CUDA backend.
#include "core/error.h"
#include "model/decoder.h"
#include "model/replica.h"

namespace trainer {

std::unique_ptr<Replica> make_cuda_replica(const ModelConfig&, const ReplicaOptions&) {
  usage_error(
      "--device cuda: this binary was built without the CUDA backend (rebuild with a CUDA "
      "toolkit and -DTRAINER_CUDA=ON)");
}

std::unique_ptr<Decoder> make_cuda_decoder(const ModelConfig&, const float*, Precision, int) {
  usage_error(
      "--device cuda: this binary was built without the CUDA backend (rebuild with a CUDA "
      "toolkit and -DTRAINER_CUDA=ON)");
}

}  // namespace trainer
