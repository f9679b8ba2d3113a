// Sums of every rank's buffer taken in rank order ((d0 + d1) + d2)..., the reference every
// host communicator (in-process threads, processes over sockets) computes, so that a world
// split across processes gives the same bits as the same ranks as threads of one process.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace moeserve::comm {

// Whether sum_inputs can add `dtype` values (F32, F64, I32, I64, BF16).
bool summable(DType dtype);

// out[i] = sum over r in rank order of inputs[r][offset + i], i in [0, count); bf16 is
// accumulated in fp32 and rounded once. `group` names the group in the error for a dtype that
// cannot be summed.
void sum_inputs(DType dtype, const std::vector<const void*>& inputs, size_t offset, size_t count, void* out,
                const std::string& group);

}  // namespace moeserve::comm
