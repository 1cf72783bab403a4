#include "model/recompute.h"

#include "core/error.h"

namespace trainer {

Recompute parse_recompute(const std::string& name) {
  if (name == "none") return Recompute::kNone;
  if (name == "ffn") return Recompute::kFfn;
  if (name == "block") return Recompute::kBlock;
  usage_error("--recompute '{}': expected 'none', 'ffn' or 'block'", name);
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kNone:
      return "none";
    case Recompute::kFfn:
      return "ffn";
    case Recompute::kBlock:
      return "block";
  }
  return "?";
}

}  // namespace trainer
