// A request's decoding constraint (structured output: a grammar's matcher state), as the step
// loop consults it between steps without knowing grammars: before a step it writes the tokens
// allowed next into the row's bitmask (ForwardBatch::token_bitmask), after it accepts the
// token drawn. Speculative drafts are walked through it and rolled back.
#pragma once

#include <cstdint>
#include <span>

namespace moeserve {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // mask [ceil(vocab / 32)]: bit id % 32 of word id / 32 set when `id` may come next.
  virtual void fill_next_mask(std::span<int32_t> mask) = 0;
  // Advances past `token`; false (and no change) when the grammar does not allow it.
  virtual bool accept(int32_t token) = 0;
  // Undoes the last `tokens` accepted tokens (speculative drafts the target rejected).
  virtual void rollback(int tokens) = 0;
  // The grammar is complete and allows nothing more but a stop token: the request stops.
  virtual bool terminated() const = 0;
};

}  // namespace moeserve
