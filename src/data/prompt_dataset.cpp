#include "dschat/data/prompt_dataset.h"

#include <thread>

#include "core/log.h"
#include "data/cache_key.h"
#include "dschat/core/error.h"
#include "dschat/data/split.h"
#include "dschat/tokenizer/tokenizer.h"

namespace dschat {
namespace data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

void validate(const PromptDataOptions& options) {
  DSCHAT_CHECK(options.phase >= 1 && options.phase <= 3, ConfigError, "phase ", options.phase,
               " is not 1 (SFT), 2 (reward) or 3 (PPO)");
  DSCHAT_CHECK(!options.data_path.empty(), ConfigError, "data_path: no datasets given");
  DSCHAT_CHECK(options.max_seq_len >= 1, ConfigError, "max_seq_len ", options.max_seq_len, " must be >= 1");
  parse_data_split(options.data_split);  // throws naming the string
  DSCHAT_CHECK(options.phase == 1 || options.sft_only_data_path.empty(), ConfigError,
               "sft_only_data_path is only used in phase 1 (given for phase ", options.phase, ")");
}

RawDatasetOptions raw_options(const PromptDataOptions& options) {
  RawDatasetOptions raw;
  raw.seed = options.seed;
  raw.skip_bad_records = options.skip_bad_records;
  raw.local_jsonfile_dir = options.local_jsonfile_dir;
  return raw;
}

std::string cache_key(const PromptDataOptions& options, const tokenizer::Tokenizer& tokenizer,
                      const std::vector<DatasetFiles>& files, const std::vector<DatasetFiles>& sft_files) {
  Sha256 hash;
  hash.field("version", kCacheFormatVersion);
  hash.field("phase", options.phase);
  hash.field("data_split", options.data_split);
  hash.field("seed", static_cast<int64_t>(options.seed));
  hash.field("max_seq_len", options.max_seq_len);
  hash.field("eot", options.end_of_conversation_token);
  hash.field("skip_bad_records", options.skip_bad_records ? 1 : 0);
  for (size_t i = 0; i < files.size(); ++i) hash_dataset(hash, "data" + std::to_string(i), options.data_path[i], files[i]);
  for (size_t i = 0; i < sft_files.size(); ++i) {
    hash_dataset(hash, "sft" + std::to_string(i), options.sft_only_data_path[i], sft_files[i]);
  }
  hash_tokenizer_dir(hash, tokenizer.directory());
  return hash.hex();
}

std::vector<std::string> texts_of(const std::vector<const PromptRecord*>& records,
                                  std::optional<std::string> PromptRecord::*view, const std::string& suffix) {
  std::vector<std::string> texts;
  texts.reserve(records.size());
  for (const auto* record : records) texts.push_back(*(record->*view) + suffix);
  return texts;
}

// Length of the common prefix of two id sequences: where the prompt ends inside PC.
int32_t common_prefix(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return static_cast<int32_t>(n);
}

// DeepSpeed-Chat's create_dataset_split for the records of one phase slice.
TokenizedDataset tokenize_phase(const std::vector<PromptRecord>& rows, const std::vector<int64_t>& indices,
                                const PromptDataOptions& options, const tokenizer::Tokenizer& tokenizer, json& stats) {
  const PhaseKind kind = static_cast<PhaseKind>(options.phase);
  auto has = [&](const PromptRecord& r) {
    if (kind == PhaseKind::kSft) return r.prompt_and_chosen.has_value();
    if (kind == PhaseKind::kReward) return r.prompt_and_chosen.has_value() && r.prompt_and_rejected.has_value();
    return r.prompt.has_value();
  };
  std::vector<const PromptRecord*> kept;
  for (int64_t index : indices) {
    if (has(rows[index])) kept.push_back(&rows[index]);
  }
  stats["rows"] = indices.size();
  stats["missing_view"] = indices.size() - kept.size();

  tokenizer::BatchOptions truncating;
  truncating.padding = tokenizer::Padding::kNone;
  truncating.num_threads = options.num_threads ? options.num_threads : std::max(1u, std::thread::hardware_concurrency());
  tokenizer::BatchOptions whole = truncating;
  truncating.truncation = true;
  truncating.max_length = static_cast<size_t>(options.max_seq_len);

  TokenizedDataset out(kind);
  const std::string& eot = options.end_of_conversation_token;
  if (kind == PhaseKind::kSft) {
    auto full = tokenizer.encode_batch(texts_of(kept, &PromptRecord::prompt_and_chosen, eot), truncating);
    std::vector<std::string> prompts;
    for (const auto* r : kept) prompts.push_back(r->prompt.value_or(""));
    auto prompt_ids = tokenizer.encode_batch(prompts, truncating);
    for (size_t i = 0; i < kept.size(); ++i) {
      // Without P (datasets with PC only) no token counts as prompt.
      int32_t prompt_len = kept[i]->prompt ? common_prefix(prompt_ids.input_ids[i], full.input_ids[i]) : 0;
      out.append({&full.input_ids[i]}, prompt_len);
    }
  } else if (kind == PhaseKind::kReward) {
    auto chosen = tokenizer.encode_batch(texts_of(kept, &PromptRecord::prompt_and_chosen, eot), truncating);
    auto rejected = tokenizer.encode_batch(texts_of(kept, &PromptRecord::prompt_and_rejected, eot), truncating);
    // Where the answers start (DPO-style losses, diagnostics): P tokenised alone the same way as
    // the rows (same special tokens, same max_seq_len truncation), so a prompt longer than
    // max_seq_len counts max_seq_len. P's own token count rather than SFT's common prefix with
    // PC: one number for both rows, where a prefix could differ between them if the tokenizer
    // merged a token across the prompt/answer boundary.
    std::vector<std::string> prompts;
    for (const auto* r : kept) prompts.push_back(r->prompt.value_or(""));
    auto prompt_ids = tokenizer.encode_batch(prompts, truncating);
    for (size_t i = 0; i < kept.size(); ++i) {
      // Without P (datasets with PC/PR only) no token counts as prompt.
      const int32_t prompt_len = kept[i]->prompt ? static_cast<int32_t>(prompt_ids.input_ids[i].size()) : 0;
      out.append({&chosen.input_ids[i], &rejected.input_ids[i]}, prompt_len);
    }
  } else {
    auto prompts = tokenizer.encode_batch(texts_of(kept, &PromptRecord::prompt, ""), whole);
    int64_t too_long = 0;
    for (auto& ids : prompts.input_ids) {
      if (static_cast<int64_t>(ids.size()) > options.max_seq_len) {
        ++too_long;
        continue;
      }
      out.append({&ids});
    }
    stats["prompts_too_long"] = too_long;
  }
  stats["items"] = out.size();
  return out;
}

// DeepSpeed-Chat's get_shuffle_idx over the concatenation of `parts`.
TokenizedDataset blend(const std::vector<TokenizedDataset>& parts, uint32_t seed) {
  std::vector<const TokenizedDataset*> pointers;
  int64_t total = 0;
  for (const auto& part : parts) {
    pointers.push_back(&part);
    total += part.size();
  }
  return TokenizedDataset::concatenate(pointers, numpy_legacy_permutation(seed, total));
}

struct Built {
  TokenizedDataset train, eval;
};

Built build_one(const DatasetSpec& spec, const DatasetFiles& files, const std::string& data_split,
                const PromptDataOptions& options, const tokenizer::Tokenizer& tokenizer, json& stats) {
  RawDataset raw = load_raw_dataset(spec, files, raw_options(options));
  const int64_t phase = options.phase - 1;
  auto train_indices = phase_indices(data_split, phase, options.seed, static_cast<int64_t>(raw.train.size()));
  auto eval_indices = phase_indices(data_split, phase, options.seed, static_cast<int64_t>(raw.eval.size()));
  stats["name"] = files.name;
  stats["bad_records_skipped"] = raw.skipped_records;
  Built built{tokenize_phase(raw.train, train_indices, options, tokenizer, stats["train"]),
              tokenize_phase(raw.eval, eval_indices, options, tokenizer, stats["eval"])};
  core::log_info("dataset ", files.name, " phase ", options.phase, ": train ", built.train.size(), " of ",
                 raw.train.size(), " rows, eval ", built.eval.size(), " of ", raw.eval.size(),
                 options.phase == 3 ? " (prompts longer than max_seq_len dropped: " : "",
                 options.phase == 3 ? std::to_string(stats["train"]["prompts_too_long"].get<int64_t>()) + ")" : "");
  return built;
}

}  // namespace

std::string prompt_dataset_cache_key(const PromptDataOptions& options, const tokenizer::Tokenizer& tokenizer) {
  validate(options);
  std::vector<DatasetFiles> files, sft_files;
  for (const auto& spec : options.data_path) files.push_back(locate_dataset(spec, raw_options(options)));
  for (const auto& spec : options.sft_only_data_path) sft_files.push_back(locate_dataset(spec, raw_options(options)));
  return cache_key(options, tokenizer, files, sft_files);
}

PhaseData create_prompt_dataset(const PromptDataOptions& options, const tokenizer::Tokenizer& tokenizer) {
  validate(options);
  std::vector<DatasetFiles> files, sft_files;
  for (const auto& spec : options.data_path) files.push_back(locate_dataset(spec, raw_options(options)));
  for (const auto& spec : options.sft_only_data_path) sft_files.push_back(locate_dataset(spec, raw_options(options)));

  PhaseData out;
  if (!options.cache_dir.empty()) {
    const std::string key = cache_key(options, tokenizer, files, sft_files);
    out.train_file = options.cache_dir / ("traindata_" + key + ".dstok");
    out.eval_file = options.cache_dir / ("evaldata_" + key + ".dstok");
    if (fs::is_regular_file(out.train_file) && fs::is_regular_file(out.eval_file)) {
      try {
        out.train = TokenizedDataset::load(out.train_file);
        out.eval = TokenizedDataset::load(out.eval_file);
        out.stats = out.train.metadata().value("stats", json::object());
        out.from_cache = true;
        core::log_info("phase ", options.phase, " data from cache ", out.train_file.string(), " (", out.train.size(),
                       " train, ", out.eval.size(), " eval)");
        return out;
      } catch (const core::FormatError& e) {
        core::log_warn("ignoring a corrupt data cache entry, rebuilding: ", e.what());
      }
    }
  }

  std::vector<TokenizedDataset> train_parts, eval_parts;
  out.stats = json::object({{"datasets", json::array()}});
  for (size_t i = 0; i < files.size(); ++i) {
    json stats;
    Built built = build_one(options.data_path[i], files[i], options.data_split, options, tokenizer, stats);
    train_parts.push_back(std::move(built.train));
    eval_parts.push_back(std::move(built.eval));
    out.stats["datasets"].push_back(stats);
  }
  // One dataset keeps its phase order; several are concatenated and shuffled with the seed.
  out.train = train_parts.size() == 1 ? std::move(train_parts.front()) : blend(train_parts, options.seed);
  out.eval = eval_parts.size() == 1 ? std::move(eval_parts.front()) : blend(eval_parts, options.seed);
  if (!sft_files.empty()) {
    std::vector<TokenizedDataset> train_all, eval_all;
    train_all.push_back(std::move(out.train));
    eval_all.push_back(std::move(out.eval));
    for (size_t i = 0; i < sft_files.size(); ++i) {
      json stats;
      Built built = build_one(options.sft_only_data_path[i], sft_files[i], "10,0,0", options, tokenizer, stats);
      stats["sft_only"] = true;
      train_all.push_back(std::move(built.train));
      eval_all.push_back(std::move(built.eval));
      out.stats["datasets"].push_back(stats);
    }
    out.train = blend(train_all, options.seed);
    out.eval = blend(eval_all, options.seed);
  }
  DSCHAT_CHECK(out.train.size() > 0, InvalidArgument, "phase ", options.phase,
               " has no training data: data_split '", options.data_split, "' gives it no rows of ",
               files.front().name, files.size() > 1 ? " and the other datasets" : "",
               ", or every row lacked the text this phase needs (see the per-dataset counts in the log)");
  if (out.eval.size() == 0) core::log_warn("phase ", options.phase, " has no evaluation data");

  if (!options.cache_dir.empty()) {
    std::error_code ec;
    fs::create_directories(options.cache_dir, ec);
    DSCHAT_CHECK(!ec, IoError, "data cache dir ", options.cache_dir.string(), ": ", ec.message());
    out.train.metadata()["stats"] = out.stats;
    out.eval.metadata()["stats"] = out.stats;
    out.train.save(out.train_file);
    out.eval.save(out.eval_file);
  }
  return out;
}

}  // namespace data
}  // namespace dschat
