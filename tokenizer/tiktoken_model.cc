// Reader of tiktoken ranks files, with the conventions of Kimi's tokenization_kimi.py.
#include <string_view>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/base64.h"
#include "tokenizer/json_file.h"
#include "tokenizer/loaders.h"

namespace moeserve::tokenizer {
namespace {

// TikTokenTokenizer.pat_str in tokenization_kimi.py (Kimi K2 / K2.5 / K2.6 / Moonlight).
constexpr const char* kKimiSplitPattern =
    R"([\p{Han}]+)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*)"
    R"(|\s*[\r\n]+)"
    R"(|\s+(?!\S))"
    R"(|\s+)";

// TikTokenTokenizer.num_reserved_special_tokens: the ids right after the ranks are special
// tokens, named by added_tokens_decoder or "<|reserved_token_ID|>".
constexpr int32_t kKimiReservedSpecialTokens = 256;

struct RanksFile {
  std::vector<std::string> token_of_rank;  // [max rank + 1]; empty for gaps
  std::vector<bool> has_rank;
  size_t count = 0;
};

RanksFile read_ranks(const std::string& path) {
  const std::string text = read_text_file(path);
  RanksFile ranks;
  std::unordered_map<std::string, size_t> line_of_token;
  std::vector<size_t> line_of_rank;
  size_t line_number = 0, pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    MS_CHECK(space != std::string_view::npos && line.find(' ', space + 1) == std::string_view::npos,
             "{}:{}: expected \"<base64 token> <rank>\"", path, line_number);
    const std::string_view encoded = line.substr(0, space);
    const std::string_view rank_text = line.substr(space + 1);
    const auto token = base64_decode(encoded);
    MS_CHECK(token.has_value() && !token->empty(), "{}:{}: invalid base64 token \"{}\"", path, line_number, encoded);
    size_t rank = 0;
    MS_CHECK(!rank_text.empty() && rank_text.size() <= 9 &&
                 rank_text.find_first_not_of("0123456789") == std::string_view::npos,
             "{}:{}: rank \"{}\" is not a non-negative integer below 10^9", path, line_number, rank_text);
    for (char c : rank_text) rank = rank * 10 + static_cast<size_t>(c - '0');
    MS_CHECK(rank < static_cast<size_t>(kMaxTokenIds), "{}:{}: rank {} is not below {} (2^24)", path, line_number, rank,
             kMaxTokenIds);
    if (rank >= ranks.token_of_rank.size()) {
      ranks.token_of_rank.resize(rank + 1);
      ranks.has_rank.resize(rank + 1, false);
      line_of_rank.resize(rank + 1, 0);
    }
    MS_CHECK(!ranks.has_rank[rank], "{}:{}: rank {} is already used by line {}", path, line_number, rank,
             line_of_rank[rank]);
    const auto [previous, inserted] = line_of_token.emplace(*token, line_number);
    MS_CHECK(inserted, "{}:{}: token \"{}\" is already listed on line {}", path, line_number, encoded,
             previous->second);
    ranks.token_of_rank[rank] = *token;
    ranks.has_rank[rank] = true;
    line_of_rank[rank] = line_number;
    ++ranks.count;
  }
  MS_CHECK(ranks.count > 0, "{}: no ranks", path);
  const auto limit = static_cast<size_t>(token_id_limit(ranks.count));
  MS_CHECK(ranks.token_of_rank.size() <= limit,
           "{}:{}: rank {} is out of range: ranks must be below {} (the {} ranks listed + {})", path,
           line_of_rank.back(), ranks.token_of_rank.size() - 1, limit, ranks.count, kMaxTokenIdGap);
  return ranks;
}

}  // namespace

TokenizerParts load_tiktoken_model(const std::string& path, const TokenizerConfig& config) {
  MS_CHECK(config.tokenizer_class == "TikTokenTokenizer",
           "{}: tokenizer_class \"{}\" is not a known tiktoken tokenizer (known: TikTokenTokenizer of "
           "Kimi's tokenization_kimi.py)",
           config.path, config.tokenizer_class);
  RanksFile ranks = read_ranks(path);

  TokenizerParts parts;
  parts.origin = path;
  const auto num_base_tokens = static_cast<int32_t>(ranks.count);
  int32_t vocab_size =
      std::max<int32_t>(static_cast<int32_t>(ranks.token_of_rank.size()), num_base_tokens + kKimiReservedSpecialTokens);
  const int64_t limit = token_id_limit(ranks.count + kKimiReservedSpecialTokens + config.added_tokens_decoder.size());
  for (const AddedTokenEntry& entry : config.added_tokens_decoder) {
    MS_CHECK(entry.id < limit,
             "{}: added_tokens_decoder[\"{}\"]: id {} is out of range: ids must be below {} (the {} ranks of {}, the "
             "reserved and added tokens, + {})",
             config.path, entry.id, entry.id, limit, ranks.count, path, kMaxTokenIdGap);
    vocab_size = std::max(vocab_size, entry.id + 1);
  }
  parts.token_bytes.assign(vocab_size, std::string());
  parts.token_kind.assign(vocab_size, TokenKind::kUnused);

  StringIdMap id_of_bytes;
  id_of_bytes.reserve(ranks.count);
  for (size_t rank = 0; rank < ranks.token_of_rank.size(); ++rank) {
    if (!ranks.has_rank[rank]) continue;
    parts.token_bytes[rank] = ranks.token_of_rank[rank];
    parts.token_kind[rank] = TokenKind::kNormal;
    id_of_bytes.emplace(ranks.token_of_rank[rank], static_cast<int32_t>(rank));
  }

  // Special tokens: every added_tokens_decoder entry, then reserved names for the unnamed
  // ids among the reserved block (tokenization_kimi.py builds them the same way).
  for (const AddedTokenEntry& entry : config.added_tokens_decoder) {
    MS_CHECK(parts.token_kind[entry.id] == TokenKind::kUnused,
             "{}: added_tokens_decoder[\"{}\"] \"{}\": id {} is already the BPE token of rank {} in {}", config.path,
             entry.id, entry.content, entry.id, entry.id, path);
    parts.token_bytes[entry.id] = entry.content;
    parts.token_kind[entry.id] = TokenKind::kSpecial;
  }
  for (int32_t id = num_base_tokens; id < num_base_tokens + kKimiReservedSpecialTokens; ++id) {
    if (parts.token_kind[id] != TokenKind::kUnused) continue;
    parts.token_bytes[id] = "<|reserved_token_" + std::to_string(id) + "|>";
    parts.token_kind[id] = TokenKind::kSpecial;
  }
  for (int32_t id = 0; id < vocab_size; ++id) {
    if (parts.token_kind[id] == TokenKind::kSpecial) parts.added_tokens.add(parts.token_bytes[id], id, true);
  }

  std::array<int32_t, 256> byte_ids;
  for (int b = 0; b < 256; ++b) {
    const auto it = id_of_bytes.find(std::string_view(reinterpret_cast<const char*>(&b), 1));
    MS_CHECK(it != id_of_bytes.end(), "{}: byte 0x{:02x} has no rank (all 256 single bytes are needed)", path, b);
    byte_ids[b] = it->second;
  }
  // tiktoken merges two adjacent parts when their concatenation is a token, lowest rank
  // first: every split of a token into two tokens is a merge of the token's rank.
  MergeTable merges;
  for (const auto& [bytes, id] : id_of_bytes) {
    for (size_t k = 1; k < bytes.size(); ++k) {
      const auto left = id_of_bytes.find(std::string_view(bytes).substr(0, k));
      if (left == id_of_bytes.end()) continue;
      const auto right = id_of_bytes.find(std::string_view(bytes).substr(k));
      if (right == id_of_bytes.end()) continue;
      merges.insert(left->second, right->second, {id, id});
    }
  }
  BpeModel::Options options;
  options.whole_piece_lookup = true;
  parts.bpe = std::make_unique<BpeModel>(byte_ids, std::move(merges), std::move(id_of_bytes), options);
  parts.pre_tokenizer.add_split(Regex(kKimiSplitPattern, "Kimi split pattern"), SplitBehavior::kMatchesOnly,
                                /*invert=*/false);
  parts.chat_template = config.chat_template;
  resolve_bos_eos(config, parts);
  return parts;
}

}  // namespace moeserve::tokenizer
