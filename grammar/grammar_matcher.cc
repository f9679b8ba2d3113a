#include "grammar/grammar_matcher.h"

#include <dlpack/dlpack.h>

#include <algorithm>

#include "core/error.h"

namespace moeserve::grammar {

VocabTables::VocabTables(std::vector<std::string> bytes, const std::vector<int32_t>& stop_ids, int64_t vocab)
    : token_bytes(std::move(bytes)),
      vocab_size(vocab),
      tokenizer_words((static_cast<int64_t>(token_bytes.size()) + 31) / 32),
      matchable(static_cast<size_t>(vocab), 0),
      utf8(token_bytes, tokenizer_words) {
  for (size_t id = 0; id < token_bytes.size(); ++id) matchable[id] = !token_bytes[id].empty();
  for (int32_t id : stop_ids) {
    MS_CHECK(id >= 0 && id < static_cast<int64_t>(token_bytes.size()),
             "grammar vocabulary: stop id {} is outside the tokenizer's {} ids", id, token_bytes.size());
    matchable[static_cast<size_t>(id)] = 1;
  }
}

namespace {

class XgrammarConstraint final : public TokenConstraint {
 public:
  explicit XgrammarConstraint(const MatcherParams& p)
      : matcher_(p.compiled, p.stop_ids.empty() ? std::nullopt : std::optional<std::vector<int>>(p.stop_ids),
                 /*terminate_without_stop_token=*/p.stop_ids.empty()),
        tables_(p.tables),
        stop_ids_(p.stop_ids),
        words_((tables_->vocab_size + 31) / 32) {}

  // mask [words_]: xgrammar's mask over the tokenizer's ids, ANDed with the ids that keep the
  // output valid UTF-8 (utf8_masks.h); the model's padded ids never.
  void fill_next_mask(std::span<int32_t> mask) override {
    MS_CHECK(static_cast<int64_t>(mask.size()) == words_,
             "grammar matcher: a mask of {} words, the vocabulary needs {}", mask.size(), words_);
    const int64_t filled = tables_->tokenizer_words;
    int64_t shape[1] = {filled};
    DLTensor tensor{};
    tensor.data = mask.data();
    tensor.device = DLDevice{kDLCPU, 0};
    tensor.ndim = 1;
    tensor.dtype = DLDataType{kDLInt, 32, 1};
    tensor.shape = shape;
    matcher_.FillNextTokenBitmask(&tensor);
    const std::span<const int32_t> utf8 = tables_->utf8.allowed(utf8_state());
    for (int64_t w = 0; w < filled; ++w) mask[w] &= utf8[w];  // utf8's bits past the tokenizer's ids are 0
    std::fill(mask.begin() + filled, mask.end(), 0);
  }
  bool accept(int32_t token) override {
    if (token < 0 || token >= static_cast<int64_t>(tables_->token_bytes.size())) return false;
    const bool stop = std::find(stop_ids_.begin(), stop_ids_.end(), token) != stop_ids_.end();
    if (!stop && !tables_->matchable[static_cast<size_t>(token)]) return false;
    const Utf8State next = utf8_after(utf8_state(), tables_->token_bytes[static_cast<size_t>(token)]);
    if (next == Utf8State::kInvalid || !matcher_.AcceptToken(token)) return false;
    utf8_states_.push_back(next);
    return true;
  }
  void rollback(int tokens) override {
    if (tokens <= 0) return;
    matcher_.Rollback(tokens);
    utf8_states_.resize(utf8_states_.size() - std::min(utf8_states_.size(), static_cast<size_t>(tokens)));
  }
  bool terminated() const override { return matcher_.IsTerminated(); }

 private:
  Utf8State utf8_state() const { return utf8_states_.empty() ? Utf8State::kBoundary : utf8_states_.back(); }

  xgrammar::GrammarMatcher matcher_;
  std::shared_ptr<const VocabTables> tables_;
  std::vector<int32_t> stop_ids_;
  int64_t words_;
  std::vector<Utf8State> utf8_states_;  // after each accepted token (rolled back with it)
};

}  // namespace

std::unique_ptr<TokenConstraint> make_matcher(const MatcherParams& params) {
  return std::make_unique<XgrammarConstraint>(params);
}

}  // namespace moeserve::grammar
