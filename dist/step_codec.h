// A step's layout (step::StepPlan: every micro-batch's replica batches) as the bytes the
// leader sends each follower every step, and back. Everything in it is host data: ids,
// positions, slots, block tables, logit rows, draws and their options.
#pragma once

#include <cstddef>
#include <vector>

#include "dist/wire.h"
#include "step/step_plan.h"

namespace moeserve::dist {

void encode_step(const step::StepPlan& step, ByteWriter& out);
step::StepPlan decode_step(ByteReader& in);

}  // namespace moeserve::dist
