// Reader of Hugging Face tokenizer.json files with a byte-level BPE model.
#include <string_view>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/json_file.h"
#include "tokenizer/loaders.h"

namespace moeserve::tokenizer {
namespace {

using Json = nlohmann::ordered_json;

std::string type_of(const Json& node, const std::string& where) {
  MS_CHECK(node.is_object(), "{} must be an object", where);
  const auto type = optional_string(node, "type", where);
  MS_CHECK(type.has_value(), "{} has no \"type\"", where);
  return *type;
}

bool bool_field(const Json& node, const char* key, bool fallback, const std::string& where) {
  const auto it = node.find(key);
  if (it == node.end() || it->is_null()) return fallback;
  MS_CHECK(it->is_boolean(), "{}: \"{}\" must be a boolean", where, key);
  return it->get<bool>();
}

void check_normalizer(const Json& node, const std::string& where) {
  if (node.is_null()) return;
  const std::string type = type_of(node, where);
  if (type == "Sequence") {
    const auto it = node.find("normalizers");
    MS_CHECK(it != node.end() && it->is_array(), "{}: Sequence needs a \"normalizers\" list", where);
    for (size_t i = 0; i < it->size(); ++i) {
      check_normalizer((*it)[i], where + ".normalizers[" + std::to_string(i) + "]");
    }
    return;
  }
  fail("{}: normalizer type \"{}\" is not supported (the DeepSeek-V3 and Kimi families use none)", where, type);
}

// A regex matching `literal` exactly.
std::string escape_regex(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) out += '\\';
    out += c;
  }
  return out;
}

SplitBehavior parse_behavior(const std::string& name, const std::string& where) {
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  fail("{}: unknown split behavior \"{}\"", where, name);
}

// Adds the steps of one pre_tokenizer node; returns true if it holds a ByteLevel step.
bool add_pre_tokenizer(const Json& node, const std::string& where, PreTokenizer& pre) {
  if (node.is_null()) return false;
  const std::string type = type_of(node, where);
  if (type == "Sequence") {
    const auto it = node.find("pretokenizers");
    MS_CHECK(it != node.end() && it->is_array(), "{}: Sequence needs a \"pretokenizers\" list", where);
    bool byte_level = false;
    for (size_t i = 0; i < it->size(); ++i) {
      byte_level = add_pre_tokenizer((*it)[i], where + ".pretokenizers[" + std::to_string(i) + "]", pre) || byte_level;
    }
    return byte_level;
  }
  if (type == "Split") {
    const auto pattern = node.find("pattern");
    MS_CHECK(pattern != node.end() && pattern->is_object(), "{}: Split needs a \"pattern\" object", where);
    std::string regex;
    if (const auto r = optional_string(*pattern, "Regex", where + ".pattern")) {
      regex = *r;
    } else if (const auto s = optional_string(*pattern, "String", where + ".pattern")) {
      regex = escape_regex(*s);
    } else {
      fail("{}.pattern needs \"Regex\" or \"String\"", where);
    }
    const auto behavior = optional_string(node, "behavior", where);
    MS_CHECK(behavior.has_value(), "{}: Split needs a \"behavior\"", where);
    pre.add_split(Regex(regex, where + ".pattern"), parse_behavior(*behavior, where),
                  bool_field(node, "invert", false, where));
    return false;
  }
  if (type == "ByteLevel") {
    pre.add_byte_level(bool_field(node, "add_prefix_space", true, where), bool_field(node, "use_regex", true, where));
    return true;
  }
  fail("{}: pre-tokenizer type \"{}\" is not supported (supported: Sequence, Split, ByteLevel)", where, type);
}

// A token id field: an integer in [0, limit) (see token_id_limit).
int32_t token_id(const Json& id_json, int64_t limit, const std::string& where) {
  const bool non_negative =
      id_json.is_number_unsigned() || (id_json.is_number_integer() && id_json.get<int64_t>() >= 0);
  MS_CHECK(non_negative, "{}: id must be a non-negative integer, got {}", where, id_json.dump());
  MS_CHECK(id_json.get<uint64_t>() < static_cast<uint64_t>(limit),
           "{}: id {} is out of range: ids must be below {} (the number of tokens listed + {}, at most 2^24)", where,
           id_json.get<uint64_t>(), limit, kMaxTokenIdGap);
  return static_cast<int32_t>(id_json.get<int64_t>());
}

struct Vocab {
  std::unordered_map<std::string, int32_t> id_of_token;  // as written in the file
  int32_t max_id = -1;
};

// `num_added`: the added tokens, which count towards the bound on ids.
Vocab read_vocab(const Json& model, size_t num_added, const std::string& where) {
  const auto it = model.find("vocab");
  MS_CHECK(it != model.end() && it->is_object(), "{}: needs a \"vocab\" object", where);
  const int64_t limit = token_id_limit(it->size() + num_added);
  Vocab vocab;
  std::unordered_map<int32_t, std::string> token_of_id;
  for (const auto& [token, id_json] : it->items()) {
    const int32_t id = token_id(id_json, limit, where + ".vocab[\"" + token + "\"]");
    const auto [existing, inserted] = token_of_id.emplace(id, token);
    MS_CHECK(inserted, "{}.vocab: id {} is used by both \"{}\" and \"{}\"", where, id, existing->second, token);
    vocab.id_of_token.emplace(token, id);
    vocab.max_id = std::max(vocab.max_id, id);
  }
  return vocab;
}

int32_t vocab_id(const Vocab& vocab, const std::string& token, const std::string& where) {
  const auto it = vocab.id_of_token.find(token);
  MS_CHECK(it != vocab.id_of_token.end(), "{}: \"{}\" is not in the vocab", where, token);
  return it->second;
}

MergeTable read_merges(const Json& model, const Vocab& vocab, const std::string& where) {
  const auto it = model.find("merges");
  MS_CHECK(it != model.end() && it->is_array(), "{}: needs a \"merges\" list", where);
  MergeTable table;
  for (size_t rank = 0; rank < it->size(); ++rank) {
    const Json& merge = (*it)[rank];
    const std::string entry = where + ".merges[" + std::to_string(rank) + "]";
    std::string left, right;
    if (merge.is_string()) {  // "left right"
      const std::string& text = merge.get_ref<const std::string&>();
      const size_t space = text.find(' ');
      MS_CHECK(space != std::string::npos && text.find(' ', space + 1) == std::string::npos,
               "{}: \"{}\" is not \"left right\"", entry, text);
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else {  // ["left", "right"]
      MS_CHECK(merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string(),
               "{}: a merge must be \"left right\" or [\"left\", \"right\"]", entry);
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    }
    const int32_t left_id = vocab_id(vocab, left, entry);
    const int32_t right_id = vocab_id(vocab, right, entry);
    const int32_t merged_id = vocab_id(vocab, left + right, entry);
    MS_CHECK(table.insert(left_id, right_id, {static_cast<int32_t>(rank), merged_id}),
             "{}: the merge \"{}\" + \"{}\" is listed twice", entry, left, right);
  }
  return table;
}

void check_unsupported_model_options(const Json& model, const std::string& where) {
  MS_CHECK(!model.contains("dropout") || model["dropout"].is_null(), "{}: BPE dropout is not supported", where);
  MS_CHECK(!bool_field(model, "byte_fallback", false, where), "{}: byte_fallback is not supported", where);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const auto value = optional_string(model, key, where);
    MS_CHECK(!value || value->empty(), "{}: \"{}\" is not supported by byte-level BPE", where, key);
  }
}

// The "model" section, which must be a BPE model without options we do not implement.
const Json& bpe_model_of(const Json& json, const std::string& path) {
  const auto model_it = json.find("model");
  MS_CHECK(model_it != json.end(), "{}: no \"model\"", path);
  const Json& model = *model_it;
  const std::string model_where = path + ": model";
  const std::string model_type = type_of(model, model_where);
  MS_CHECK(model_type == "BPE", "{}: model type \"{}\" is not supported (only BPE)", path, model_type);
  check_unsupported_model_options(model, model_where);
  return model;
}

// Byte-level BPE decodes with ByteLevel; a normalizer, if any, must be one we implement.
void check_decoder_and_normalizer(const Json& json, const std::string& path) {
  const std::string decoder_where = path + ": decoder";
  const auto decoder = json.find("decoder");
  MS_CHECK(decoder != json.end() && !decoder->is_null(), "{} is missing (byte-level BPE needs ByteLevel)",
           decoder_where);
  const std::string decoder_type = type_of(*decoder, decoder_where);
  MS_CHECK(decoder_type == "ByteLevel", "{}: decoder type \"{}\" is not supported (only ByteLevel)", path,
           decoder_type);
  if (const auto normalizer = json.find("normalizer"); normalizer != json.end()) {
    check_normalizer(*normalizer, path + ": normalizer");
  }
}

// "added_tokens", or null when the file has none.
const Json* added_tokens_of(const Json& json, const std::string& path) {
  const auto added = json.find("added_tokens");
  if (added == json.end() || added->is_null()) return nullptr;
  MS_CHECK(added->is_array(), "{}: \"added_tokens\" must be a list", path);
  return &*added;
}

int64_t added_id_limit(const Vocab& vocab, const Json& added) {
  return token_id_limit(vocab.id_of_token.size() + added.size());
}

// The id of added_tokens[i], checked against the bound on ids.
int32_t added_token_id(const Json& entry, int64_t limit, const std::string& where) {
  MS_CHECK(entry.is_object() && entry.contains("id"), "{}: needs a non-negative integer \"id\"", where);
  return token_id(entry["id"], limit, where);
}

std::string added_where(const std::string& path, size_t i) {
  return path + ": added_tokens[" + std::to_string(i) + "]";
}

// Added tokens may extend the vocabulary past the model's ids.
int32_t max_token_id(const Vocab& vocab, const Json* added, const std::string& path) {
  int32_t max_id = vocab.max_id;
  if (added == nullptr) return max_id;
  const int64_t limit = added_id_limit(vocab, *added);
  for (size_t i = 0; i < added->size(); ++i) {
    max_id = std::max(max_id, added_token_id((*added)[i], limit, added_where(path, i)));
  }
  return max_id;
}

// What BPE needs of the vocab: the id of each single byte and of each token it can produce.
struct BpeVocab {
  std::array<int32_t, 256> byte_ids;
  StringIdMap tokens;  // raw bytes -> id
};

// The model's vocab into parts.token_bytes/token_kind (sized already) and into BPE's tables.
BpeVocab add_vocab_tokens(const Vocab& vocab, TokenizerParts& parts) {
  BpeVocab bpe;
  bpe.byte_ids.fill(-1);
  for (const auto& [token, id] : vocab.id_of_token) {
    // A token outside the byte-level alphabet stands for its own UTF-8 (Hugging Face's
    // ByteLevel decoder does the same); BPE never produces it.
    const auto bytes = byte_level_to_bytes(token);
    parts.token_bytes[id] = bytes ? *bytes : token;
    parts.token_kind[id] = TokenKind::kNormal;
    if (!bytes) continue;
    bpe.tokens.emplace(*bytes, id);
    if (bytes->size() == 1) bpe.byte_ids[static_cast<uint8_t>((*bytes)[0])] = id;
  }
  return bpe;
}

void add_added_tokens(const Json& added, const Vocab& vocab, const std::string& path, TokenizerParts& parts) {
  const int64_t limit = added_id_limit(vocab, added);
  for (size_t i = 0; i < added.size(); ++i) {
    const Json& entry = added[i];
    const std::string where = added_where(path, i);
    const int32_t id = added_token_id(entry, limit, where);
    const auto content = optional_string(entry, "content", where);
    MS_CHECK(content && !content->empty(), "{}: needs a non-empty \"content\"", where);
    for (const char* option : {"single_word", "lstrip", "rstrip"}) {
      MS_CHECK(!bool_field(entry, option, false, where), "{} \"{}\": {}=true is not supported", where, *content,
               option);
    }
    const bool special = bool_field(entry, "special", false, where);
    const auto bytes = byte_level_to_bytes(*content);
    parts.token_bytes[id] = bytes ? *bytes : *content;
    parts.token_kind[id] = special ? TokenKind::kSpecial : TokenKind::kAdded;
    parts.added_tokens.add(*content, id, special);
  }
}

BpeModel::Options bpe_options(const Json& model, const Vocab& vocab, const std::string& model_where) {
  BpeModel::Options options;
  options.whole_piece_lookup = bool_field(model, "ignore_merges", false, model_where);
  options.fuse_unk = bool_field(model, "fuse_unk", false, model_where);
  if (const auto unk = optional_string(model, "unk_token", model_where)) {
    options.unk_id = vocab_id(vocab, *unk, model_where + ".unk_token");
  }
  return options;
}

}  // namespace

TokenizerParts load_hf_tokenizer_json(const std::string& path, const TokenizerConfig& config) {
  const Json json = read_json_file(path);
  MS_CHECK(json.is_object(), "{}: the top level must be a JSON object", path);
  const Json& model = bpe_model_of(json, path);
  const std::string model_where = path + ": model";
  check_decoder_and_normalizer(json, path);

  TokenizerParts parts;
  parts.origin = path;
  const auto pre_tokenizer = json.find("pre_tokenizer");
  const bool has_byte_level =
      pre_tokenizer != json.end() && add_pre_tokenizer(*pre_tokenizer, path + ": pre_tokenizer", parts.pre_tokenizer);
  MS_CHECK(has_byte_level, "{}: pre_tokenizer has no ByteLevel step (needed by byte-level BPE)", path);

  const Json* added = added_tokens_of(json, path);
  const Vocab vocab = read_vocab(model, added == nullptr ? 0 : added->size(), model_where);
  MergeTable merges = read_merges(model, vocab, model_where);
  const int32_t max_id = max_token_id(vocab, added, path);
  parts.token_bytes.assign(max_id + 1, std::string());
  parts.token_kind.assign(max_id + 1, TokenKind::kUnused);
  BpeVocab bpe = add_vocab_tokens(vocab, parts);
  if (added != nullptr) add_added_tokens(*added, vocab, path, parts);

  parts.bpe = std::make_unique<BpeModel>(bpe.byte_ids, std::move(merges), std::move(bpe.tokens),
                                         bpe_options(model, vocab, model_where));
  parts.chat_template = config.chat_template;
  resolve_bos_eos(config, parts);
  return parts;
}

void resolve_bos_eos(const TokenizerConfig& config, TokenizerParts& parts) {
  auto resolve = [&](const std::optional<std::string>& text, const char* field, std::optional<int32_t>& id_out,
                     std::string& text_out) {
    if (!text) return;
    const auto match = parts.added_tokens.find(*text, 0, /*allow_special=*/true);
    MS_CHECK(match && match->begin == 0 && match->length == text->size(), "{}: {} \"{}\" is not an added token of {}",
             config.path, field, *text, parts.origin);
    id_out = match->id;
    text_out = *text;
  };
  resolve(config.bos_token, "bos_token", parts.bos_id, parts.bos_token);
  resolve(config.eos_token, "eos_token", parts.eos_id, parts.eos_token);
}

}  // namespace moeserve::tokenizer
