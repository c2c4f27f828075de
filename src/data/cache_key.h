#pragma once
// Pieces of the tokenised-data cache keys shared by the prompt and unsupervised datasets.

#include <filesystem>
#include <string>

#include "io/sha256.h"
#include "dschat/data/raw_dataset.h"

namespace dschat {
namespace data {

using io::Sha256;
using io::sha256_of_file;

/// Bumped whenever tokenisation or the file layout changes, so old cache entries are never used.
/// 2: reward pairs store their prompt lengths (version-1 entries hold zeros there).
constexpr int64_t kCacheFormatVersion = 2;

/// Adds the contents of every tokenizer file in `dir` that can change the ids.
void hash_tokenizer_dir(Sha256& hash, const std::filesystem::path& dir);

/// Adds a dataset's name, schema and the contents of its train and eval files.
void hash_dataset(Sha256& hash, const std::string& role, const DatasetSpec& spec, const DatasetFiles& files);

}  // namespace data
}  // namespace dschat
