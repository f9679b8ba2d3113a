#include "model/graph_cache.h"

namespace moeserve {

void GraphCache::run(const Key& key, const std::function<void()>& step) {
  auto graph = graphs_.find(key);
  if (graph == graphs_.end() && warmed_up_.count(key)) {
    backend_.begin_capture();
    step();
    graph = graphs_.emplace(key, backend_.end_capture()).first;
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
