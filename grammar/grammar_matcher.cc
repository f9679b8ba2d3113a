#include "grammar/grammar_matcher.h"

#include <dlpack/dlpack.h>

#include "core/error.h"

namespace moeserve::grammar {
namespace {

class XgrammarConstraint final : public TokenConstraint {
 public:
  explicit XgrammarConstraint(const MatcherParams& p)
      : matcher_(p.compiled, p.stop_ids.empty() ? std::nullopt : std::optional<std::vector<int>>(p.stop_ids),
                 /*terminate_without_stop_token=*/p.stop_ids.empty()),
        words_((p.vocab_size + 31) / 32),
        matchable_(p.matchable) {}

  void fill_next_mask(std::span<int32_t> mask) override {
    MS_CHECK(static_cast<int64_t>(mask.size()) == words_,
             "grammar matcher: a mask of {} words, the vocabulary needs {}", mask.size(), words_);
    int64_t shape[1] = {words_};
    DLTensor tensor{};
    tensor.data = mask.data();
    tensor.device = DLDevice{kDLCPU, 0};
    tensor.ndim = 1;
    tensor.dtype = DLDataType{kDLInt, 32, 1};
    tensor.shape = shape;
    matcher_.FillNextTokenBitmask(&tensor);
  }
  bool accept(int32_t token) override {
    if (token < 0 || static_cast<size_t>(token) >= matchable_->size() || !(*matchable_)[static_cast<size_t>(token)])
      return false;
    return matcher_.AcceptToken(token);
  }
  void rollback(int tokens) override {
    if (tokens > 0) matcher_.Rollback(tokens);
  }
  bool terminated() const override { return matcher_.IsTerminated(); }

 private:
  xgrammar::GrammarMatcher matcher_;
  int64_t words_;
  std::shared_ptr<const std::vector<uint8_t>> matchable_;
};

}  // namespace

std::unique_ptr<TokenConstraint> make_matcher(const MatcherParams& params) {
  return std::make_unique<XgrammarConstraint>(params);
}

}  // namespace moeserve::grammar
