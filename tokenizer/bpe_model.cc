#include "tokenizer/bpe_model.h"

#include <queue>

namespace moeserve::tokenizer {

void MergeTable::grow() {
  const size_t capacity = slots_.empty() ? 1024 : slots_.size() * 2;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(capacity, Slot{});
  mask_ = capacity - 1;
  shift_ = 64 - __builtin_ctzll(capacity);
  for (const Slot& s : old) {
    if (s.key == kEmpty) continue;
    size_t i = slot_of(s.key);
    while (slots_[i].key != kEmpty) i = (i + 1) & mask_;
    slots_[i] = s;
  }
}

bool MergeTable::insert(int32_t left_id, int32_t right_id, Merge merge) {
  // Keep the load factor under 1/2: probes stay short.
  if ((size_ + 1) * 2 > slots_.size()) grow();
  const uint64_t key = pack(left_id, right_id);
  size_t i = slot_of(key);
  while (slots_[i].key != kEmpty) {
    if (slots_[i].key == key) return false;
    i = (i + 1) & mask_;
  }
  slots_[i] = Slot{key, merge};
  ++size_;
  return true;
}

BpeModel::BpeModel(std::array<int32_t, 256> byte_ids, MergeTable merges, StringIdMap whole_tokens, Options options)
    : byte_ids_(byte_ids), merges_(std::move(merges)), whole_tokens_(std::move(whole_tokens)), options_(options) {
  all_bytes_known_ = true;
  for (int32_t id : byte_ids_) all_bytes_known_ = all_bytes_known_ && id >= 0;
}

void BpeModel::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (piece.size() == 1 && byte_ids_[static_cast<uint8_t>(piece[0])] >= 0) {
    out.push_back(byte_ids_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  if (options_.whole_piece_lookup) {
    const auto it = whole_tokens_.find(piece);
    if (it != whole_tokens_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = piece.size() <= kCacheMaxPieceBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    const auto it = cache_.find(piece);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first_new = out.size();
  if (all_bytes_known_) {
    merge_known_bytes(piece, out);
  } else {
    // Bytes without a token split the piece: each run of known bytes merges on its own and the
    // unknown bytes become unk ids (or vanish without an unk token).
    size_t run_start = 0;
    bool last_was_unk = false;
    for (size_t i = 0; i <= piece.size(); ++i) {
      if (i < piece.size() && byte_ids_[static_cast<uint8_t>(piece[i])] >= 0) continue;
      if (i > run_start) {
        merge_known_bytes(piece.substr(run_start, i - run_start), out);
        last_was_unk = false;
      }
      if (i < piece.size() && options_.unk_id) {
        if (!(options_.fuse_unk && last_was_unk)) out.push_back(*options_.unk_id);
        last_was_unk = true;
      }
      run_start = i + 1;
    }
  }
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kCacheMaxEntries) cache_.clear();
    cache_.emplace(std::string(piece), std::vector<int32_t>(out.begin() + first_new, out.end()));
  }
}

void BpeModel::merge_known_bytes(std::string_view run, std::vector<int32_t>& out) const {
  // The quadratic scan beats a heap on the short pieces that make up almost all text; long
  // pieces (whitespace runs, long words) take the heap.
  if (run.size() <= 128) {
    merge_small(run, out);
  } else {
    merge_large(run, out);
  }
}

namespace {
constexpr int32_t kNoRank = INT32_MAX;
}

void BpeModel::merge_small(std::string_view run, std::vector<int32_t>& out) const {
  const int n = static_cast<int>(run.size());
  // Symbols live in arrays indexed by their first byte; `next` links the live ones.
  int32_t ids[128], next[128], rank[128], merged[128];
  for (int i = 0; i < n; ++i) {
    ids[i] = byte_ids_[static_cast<uint8_t>(run[i])];
    next[i] = i + 1;
  }
  auto rank_pair = [&](int i) {
    if (next[i] >= n) {
      rank[i] = kNoRank;
      return;
    }
    const MergeTable::Merge* m = merges_.find(ids[i], ids[next[i]]);
    rank[i] = m ? m->rank : kNoRank;
    merged[i] = m ? m->merged_id : -1;
  };
  for (int i = 0; i < n; ++i) rank_pair(i);
  while (true) {
    int best = -1, best_prev = -1;
    int32_t best_rank = kNoRank;
    for (int i = 0, prev = -1; i < n; prev = i, i = next[i]) {
      if (rank[i] < best_rank) {
        best_rank = rank[i];
        best = i;
        best_prev = prev;
      }
    }
    if (best < 0) break;
    ids[best] = merged[best];
    next[best] = next[next[best]];
    rank_pair(best);
    if (best_prev >= 0) rank_pair(best_prev);
  }
  for (int i = 0; i < n; i = next[i]) out.push_back(ids[i]);
}

void BpeModel::merge_large(std::string_view run, std::vector<int32_t>& out) const {
  const size_t n = run.size();
  std::vector<int32_t> ids(n), next(n), prev(n);
  std::vector<bool> alive(n, true);
  for (size_t i = 0; i < n; ++i) {
    ids[i] = byte_ids_[static_cast<uint8_t>(run[i])];
    next[i] = static_cast<int32_t>(i + 1);
    prev[i] = static_cast<int32_t>(i) - 1;
  }
  // Candidate merges ordered by (rank, position): the lowest rank, leftmost first. Entries go
  // stale when a neighbour merges; they are checked against the current ids when popped.
  struct Candidate {
    int32_t rank;
    int32_t left;
    int32_t left_id, right_id, merged_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto push_pair = [&](int32_t left) {
    if (left < 0 || next[left] >= static_cast<int32_t>(n)) return;
    const int32_t right = next[left];
    if (const MergeTable::Merge* m = merges_.find(ids[left], ids[right])) {
      queue.push(Candidate{m->rank, left, ids[left], ids[right], m->merged_id});
    }
  };
  for (size_t i = 0; i + 1 < n; ++i) push_pair(static_cast<int32_t>(i));
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    const int32_t right = next[c.left];
    if (!alive[c.left] || right >= static_cast<int32_t>(n) || ids[c.left] != c.left_id || ids[right] != c.right_id) {
      continue;
    }
    ids[c.left] = c.merged_id;
    alive[right] = false;
    next[c.left] = next[right];
    if (next[right] < static_cast<int32_t>(n)) prev[next[right]] = c.left;
    push_pair(prev[c.left]);
    push_pair(c.left);
  }
  for (int32_t i = 0; i < static_cast<int32_t>(n); i = next[i]) out.push_back(ids[i]);
}

}  // namespace moeserve::tokenizer
