#include "kv/radix_cache.h"

#include "core/error.h"

namespace moeserve::kv {

struct RadixCache::Node {
  Node* parent = nullptr;
  Key key;  // the page's tokens
  int32_t page = -1;
  uint64_t last_use = 0;
  std::map<Key, std::unique_ptr<Node>> children;
};

RadixCache::RadixCache(int64_t page_size) : page_size_(page_size), root_(std::make_unique<Node>()) {
  MS_CHECK(page_size > 0, "prefix cache: page size {} must be positive", page_size);
}

RadixCache::~RadixCache() = default;

void RadixCache::erase_leaf_entry(Node* node) { leaves_.erase({node->last_use, node}); }

void RadixCache::set_leaf_entry(Node* node) {
  if (node != root_.get() && node->children.empty()) leaves_.insert({node->last_use, node});
}

void RadixCache::touch(Node* node) {
  const bool leaf = node->children.empty();
  if (leaf) erase_leaf_entry(node);
  node->last_use = ++clock_;
  if (leaf) set_leaf_entry(node);
}

std::vector<int32_t> RadixCache::match(std::span<const int32_t> tokens, int64_t max_pages) {
  std::vector<int32_t> pages;
  Node* node = root_.get();
  Key key(static_cast<size_t>(page_size_));
  const int64_t whole = static_cast<int64_t>(tokens.size()) / page_size_;
  for (int64_t p = 0; p < std::min(whole, max_pages); ++p) {
    key.assign(tokens.begin() + p * page_size_, tokens.begin() + (p + 1) * page_size_);
    auto child = node->children.find(key);
    if (child == node->children.end()) break;
    node = child->second.get();
    pages.push_back(node->page);
  }
  // Mark the path used, deepest first, so that a parent is never older than its child.
  for (Node* n = node; n != root_.get(); n = n->parent) touch(n);
  return pages;
}

std::vector<int32_t> RadixCache::insert(std::span<const int32_t> tokens, std::span<const int32_t> pages,
                                        std::vector<bool>& added) {
  MS_CHECK(static_cast<int64_t>(pages.size()) * page_size_ <= static_cast<int64_t>(tokens.size()),
           "prefix cache: {} pages need {} tokens, got {}", pages.size(), pages.size() * page_size_, tokens.size());
  std::vector<int32_t> canonical(pages.size());
  added.assign(pages.size(), false);
  Node* node = root_.get();
  for (size_t p = 0; p < pages.size(); ++p) {
    Key key(tokens.begin() + static_cast<int64_t>(p) * page_size_,
            tokens.begin() + static_cast<int64_t>(p + 1) * page_size_);
    auto child = node->children.find(key);
    if (child == node->children.end()) {
      if (node->children.empty()) erase_leaf_entry(node);  // the parent stops being a leaf
      auto fresh = std::make_unique<Node>();
      fresh->parent = node;
      fresh->key = key;
      fresh->page = pages[p];
      fresh->last_use = ++clock_;
      child = node->children.emplace(std::move(key), std::move(fresh)).first;
      ++nodes_;
      added[p] = true;
    }
    node = child->second.get();
    canonical[p] = node->page;
  }
  set_leaf_entry(node);
  for (Node* n = node; n != root_.get(); n = n->parent) touch(n);
  return canonical;
}

std::optional<int32_t> RadixCache::evict_one(const std::function<bool(int32_t)>& can_evict) {
  for (auto it = leaves_.begin(); it != leaves_.end(); ++it) {
    Node* leaf = it->second;
    if (!can_evict(leaf->page)) continue;
    const int32_t page = leaf->page;
    leaves_.erase(it);
    Node* parent = leaf->parent;
    const Key key = leaf->key;
    parent->children.erase(key);  // frees the leaf
    --nodes_;
    set_leaf_entry(parent);
    return page;
  }
  return std::nullopt;
}

std::vector<int32_t> RadixCache::all_pages() const {
  std::vector<int32_t> out;
  std::vector<const Node*> stack{root_.get()};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    if (n != root_.get()) out.push_back(n->page);
    for (const auto& [key, child] : n->children) stack.push_back(child.get());
  }
  return out;
}

}  // namespace moeserve::kv
