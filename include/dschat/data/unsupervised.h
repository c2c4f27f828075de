#pragma once
// Unsupervised text for PPO's mixture training (DeepSpeed-Chat's get_unsupervised_data): every
// text of the train split is tokenised (with the tokenizer's special tokens, as `tokenizer(text)`
// adds them), the ids are concatenated and cut into blocks of block_size =
// max_prompt_seq_len + max_answer_seq_len; collate them with collate_sft (labels = ids).
//
// DeepSpeed-Chat concatenates within each map() batch of 1000 texts, dropping every batch's tail
// and keeping a short block when a batch has less than one block; we concatenate the whole split
// and drop only the final partial block, so no text in the middle is lost.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "dschat/data/tokenized_dataset.h"

namespace dschat {
namespace tokenizer {
class Tokenizer;
}
namespace data {

struct UnsupervisedDataOptions {
  /// Files (.parquet/.json/.jsonl), directories with a train split, or hub ids (datasets--org--name).
  std::vector<std::string> paths;
  std::string text_field = "text";
  int64_t block_size = 512;
  std::filesystem::path cache_dir = "/tmp/data_files";  // empty disables the cache
  bool skip_bad_records = false;
  size_t num_threads = 0;  // 0: hardware concurrency
};

/// Blocks of block_size tokens (kind kSft, prompt length 0). Throws core::FormatError naming the
/// file and line for a record without a string `text_field`, core::InvalidArgument when the text
/// gives no full block.
TokenizedDataset create_unsupervised_dataset(const UnsupervisedDataOptions& options,
                                             const tokenizer::Tokenizer& tokenizer);

}  // namespace data
}  // namespace dschat
