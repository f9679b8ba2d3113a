#include "core/error.h"
#include "ops/ops.h"

namespace moeserve::ops {

int64_t checked_logit_rows(const SampleParams& p) {
  const int64_t logit_rows = p.logit_rows < 0 ? p.rows : p.logit_rows;
  MS_CHECK(p.slices >= 1 && p.vocab % p.slices == 0, "sample: vocab {} is not split into {} equal slices", p.vocab,
           p.slices);
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t id = sample_logit_row(p, r);
    MS_CHECK(id >= 0 && id < logit_rows, "sample: row {} reads logit row {} of {}", r, id, logit_rows);
  }
  return logit_rows;
}

}  // namespace moeserve::ops
