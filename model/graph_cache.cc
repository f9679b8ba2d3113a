#include "model/graph_cache.h"

#include "core/log.h"

namespace moeserve {

void GraphCache::run(const Key& key, const std::function<void()>& step) {
  auto graph = graphs_.find(key);
  if (graph == graphs_.end() && warmed_up_.count(key)) {
    backend_.begin_capture();
    step();
    graph = graphs_.emplace(key, backend_.end_capture()).first;
    // Captures while serving cost a step's time each (the draft budget measures them).
    log(LogLevel::kDebug, "graph {} captured: {} tokens, {} logit rows, block tables {} wide, {}", graphs_.size(),
        key.tokens, key.logit_rows, key.max_pages_per_seq, key.mtp_draft ? "MTP draft step" : "target step");
  }
  if (graph != graphs_.end()) {
    backend_.replay(*graph->second);
    return;
  }
  warmed_up_.insert(key);  // the first run of a shape sizes every lazily grown workspace
  step();
}

void GraphCache::drop_tokens(int64_t tokens) {
  for (auto it = graphs_.begin(); it != graphs_.end();)
    it = it->first.tokens == tokens ? graphs_.erase(it) : std::next(it);
}

}  // namespace moeserve
