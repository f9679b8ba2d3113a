#include "comm/fused_all_reduce_norm.h"

namespace moeserve::comm {

FusedAllReduceNorm* fused_all_reduce_norm(Communicator& comm) {
  auto* fused = dynamic_cast<FusedAllReduceNorm*>(&comm);
  return fused != nullptr && fused->fused_all_reduce_norm_available() ? fused : nullptr;
}

}  // namespace moeserve::comm
