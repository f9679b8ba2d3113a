#include "tokenizer/bpe_model.h"

#include <gtest/gtest.h>

namespace moeserve::tokenizer {
namespace {

// Bytes 'a'..'c' are ids 0..2; merges: a+b -> "ab" (id 3, rank 0), ab+ab -> "abab" (id 4,
// rank 1), b+c -> "bc" (id 5, rank 2), a+bc -> "abc" (id 6, rank 3).
BpeModel make_model(BpeModel::Options options = {}) {
  std::array<int32_t, 256> byte_ids;
  byte_ids.fill(-1);
  byte_ids['a'] = 0;
  byte_ids['b'] = 1;
  byte_ids['c'] = 2;
  MergeTable merges;
  merges.insert(0, 1, {0, 3});
  merges.insert(3, 3, {1, 4});
  merges.insert(1, 2, {2, 5});
  merges.insert(0, 5, {3, 6});
  StringIdMap whole{{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"abab", 4}, {"bc", 5}, {"abc", 6}};
  return BpeModel(byte_ids, std::move(merges), std::move(whole), options);
}

std::vector<int32_t> encode(const BpeModel& model, std::string_view piece) {
  std::vector<int32_t> out;
  model.encode_piece(piece, out);
  return out;
}

TEST(MergeTable, FindsWhatWasInserted) {
  MergeTable table;
  for (int32_t i = 0; i < 5000; ++i) EXPECT_TRUE(table.insert(i, i + 1, {i, i + 2}));
  EXPECT_FALSE(table.insert(7, 8, {0, 0}));  // the first entry stays
  EXPECT_EQ(table.size(), 5000u);
  EXPECT_EQ(table.find(7, 8)->merged_id, 9);
  EXPECT_EQ(table.find(8, 7), nullptr);
}

TEST(BpeModel, LowestRankFirstLeftmostOnTies) {
  const BpeModel model = make_model();
  EXPECT_EQ(encode(model, "abab"), (std::vector<int32_t>{4}));
  EXPECT_EQ(encode(model, "abc"), (std::vector<int32_t>{3, 2}));  // a+b (rank 0) wins over b+c
  EXPECT_EQ(encode(model, "bcab"), (std::vector<int32_t>{5, 3}));
  EXPECT_EQ(encode(model, "aaa"), (std::vector<int32_t>{0, 0, 0}));
}

TEST(BpeModel, LongPiecesTakeTheHeapPathWithTheSameResult) {
  const BpeModel model = make_model();
  std::string piece;
  for (int i = 0; i < 100; ++i) piece += "ab";  // 200 bytes: above the quadratic-scan limit
  EXPECT_EQ(encode(model, piece), std::vector<int32_t>(50, 4));
  EXPECT_EQ(encode(model, piece + "c"), [] {
    std::vector<int32_t> ids(50, 4);
    ids.push_back(2);
    return ids;
  }());
  std::string short_piece = "bcabc";
  std::string long_piece;
  std::vector<int32_t> want;
  for (int i = 0; i < 40; ++i) {
    long_piece += short_piece;
    const auto ids = encode(model, short_piece);
    want.insert(want.end(), ids.begin(), ids.end());
  }
  // Copies of a piece that starts and ends with unmergeable boundaries merge independently.
  EXPECT_EQ(encode(model, short_piece), (std::vector<int32_t>{5, 3, 2}));
  EXPECT_EQ(encode(model, long_piece), want);
}

TEST(BpeModel, WholePieceLookupSkipsMerging) {
  BpeModel::Options options;
  options.whole_piece_lookup = true;
  EXPECT_EQ(encode(make_model(options), "abc"), (std::vector<int32_t>{6}));
  EXPECT_EQ(encode(make_model(), "abc"), (std::vector<int32_t>{3, 2}));
}

TEST(BpeModel, UnknownBytes) {
  EXPECT_EQ(encode(make_model(), "abxxab"), (std::vector<int32_t>{3, 3}));  // dropped without unk
  BpeModel::Options options;
  options.unk_id = 99;
  EXPECT_EQ(encode(make_model(options), "abxxab"), (std::vector<int32_t>{3, 99, 99, 3}));
  options.fuse_unk = true;
  EXPECT_EQ(encode(make_model(options), "abxxab"), (std::vector<int32_t>{3, 99, 3}));
}

}  // namespace
}  // namespace moeserve::tokenizer
