#pragma once
// DeepSpeed-Chat's create_prompt_dataset: the tokenised train and eval data of one phase.
//
// For each data_path entry: the phase's slice of its train split and of its eval split
// (data_split, seed; see split.h), tokenised as the phase needs:
//   phase 1 (SFT)    PC + end_of_conversation_token, truncated to max_seq_len (head kept);
//                    records without PC are skipped;
//   phase 2 (reward) PC + eot and PR + eot, each truncated to max_seq_len; records missing either
//                    are skipped; each pair stores the token count of P tokenised alone (same
//                    truncation) as its prompt length;
//   phase 3 (PPO)    P alone, not truncated: prompts longer than max_seq_len (pass
//                    max_prompt_seq_len) are dropped and counted.
// Several datasets are concatenated and permuted with the seed (numpy's RandomState shuffle, as
// DeepSpeed-Chat); phase 1 adds every sft_only_data_path dataset whole ("10,0,0") and permutes
// again. Sequences are stored unpadded; the collators pad them.
//
// The result is cached in cache_dir under a SHA-256 of everything that changes it: the contents of
// every data file and tokenizer file and every option below. Unlike DeepSpeed-Chat's cache
// (keyed on names only), editing a data file or the tokenizer's special tokens makes a new entry.
// Files are written atomically, so concurrent builders on one node cannot corrupt each other.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "dschat/data/raw_dataset.h"
#include "dschat/data/tokenized_dataset.h"

namespace dschat {
namespace tokenizer {
class Tokenizer;
}
namespace data {

struct PromptDataOptions {
  std::vector<DatasetSpec> data_path = {DatasetSpec{"Dahoas/rm-static", std::nullopt}};
  std::string data_split = "2,4,4";
  std::vector<DatasetSpec> sft_only_data_path;  // phase 1 only
  int phase = 1;                                // 1, 2 or 3
  uint32_t seed = 1234;
  int64_t max_seq_len = 512;  // phase 3: max_prompt_seq_len
  /// Appended to PC/PR in phases 1 and 2. DeepSpeed-Chat: eos text in step 1, "<|endoftext|>"
  /// in step 2.
  std::string end_of_conversation_token;
  /// Where tokenised data is cached; empty disables the cache.
  std::filesystem::path cache_dir = "/tmp/data_files";
  bool skip_bad_records = false;
  std::filesystem::path local_jsonfile_dir = "data";
  size_t num_threads = 0;  // tokenizer threads; 0: hardware concurrency
};

struct PhaseData {
  TokenizedDataset train;
  TokenizedDataset eval;
  bool from_cache = false;
  std::filesystem::path train_file, eval_file;  // cache files (empty without a cache)
  /// Per dataset: rows of the phase before/after skipping and filtering, prompts dropped for
  /// length, bad records skipped. Also stored in the cache files' metadata.
  nlohmann::json stats;
};

/// Builds (or loads from the cache) one phase's data. Throws core::ConfigError for bad options,
/// core::NotFound / IoError / FormatError naming the file for missing or bad data, and
/// core::InvalidArgument when the phase's train data ends up empty.
PhaseData create_prompt_dataset(const PromptDataOptions& options, const tokenizer::Tokenizer& tokenizer);

/// The cache key create_prompt_dataset would use (hashes the files; reads nothing else).
std::string prompt_dataset_cache_key(const PromptDataOptions& options, const tokenizer::Tokenizer& tokenizer);

}  // namespace data
}  // namespace dschat
