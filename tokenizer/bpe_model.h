// Byte-level BPE over raw bytes, shared by the tokenizer.json and tiktoken formats.
// A piece starts as one symbol per byte; the adjacent pair with the lowest merge rank is merged
// (the leftmost one on ties) until no ranked pair is left. This is the merge loop of both
// Hugging Face's BPE model and tiktoken; only the meaning of "rank" differs (the merge's line
// in tokenizer.json, the merged token's rank in tiktoken), and loaders encode that in the table.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace moeserve::tokenizer {

// Open-addressing hash map (left id, right id) -> (rank, merged id).
class MergeTable {
 public:
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  // Returns false if the pair is already present (the table keeps the first one).
  bool insert(int32_t left_id, int32_t right_id, Merge merge);
  const Merge* find(int32_t left_id, int32_t right_id) const {
    if (slots_.empty()) return nullptr;
    const uint64_t key = pack(left_id, right_id);
    for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s.merge;
      if (s.key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  struct Slot {
    uint64_t key = kEmpty;
    Merge merge{};
  };
  static uint64_t pack(int32_t l, int32_t r) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
  }
  size_t slot_of(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ull) >> shift_; }
  void grow();

  std::vector<Slot> slots_;
  size_t size_ = 0;
  size_t mask_ = 0;
  int shift_ = 64;
};

// Hash and equality that let unordered_map<std::string, ...> be searched with a string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  struct Options {
    // Emit a piece that is itself a token directly, without merging (tiktoken always does this;
    // tokenizer.json says so with "ignore_merges": true).
    bool whole_piece_lookup = false;
    // Id for bytes that have no token (tokenizer.json "unk_token"); without one they are dropped.
    std::optional<int32_t> unk_id;
    bool fuse_unk = false;  // consecutive unknown bytes give one unk id
  };

  // byte_ids[b]: token of the single byte b, or -1. whole_tokens: raw bytes -> id of every BPE
  // token, used only with options.whole_piece_lookup.
  BpeModel(std::array<int32_t, 256> byte_ids, MergeTable merges, StringIdMap whole_tokens, Options options);

  // Appends the ids of one pre-tokenized piece to `out`.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  const MergeTable& merges() const { return merges_; }

 private:
  void merge_known_bytes(std::string_view run, std::vector<int32_t>& out) const;
  void merge_small(std::string_view run, std::vector<int32_t>& out) const;
  void merge_large(std::string_view run, std::vector<int32_t>& out) const;

  std::array<int32_t, 256> byte_ids_;
  bool all_bytes_known_;
  MergeTable merges_;
  StringIdMap whole_tokens_;  // raw bytes -> id
  Options options_;

  // Cache of merged pieces: most words recur. Guarded by a mutex; bounded.
  static constexpr size_t kCacheMaxEntries = 1 << 16;
  static constexpr size_t kCacheMaxPieceBytes = 64;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace moeserve::tokenizer
