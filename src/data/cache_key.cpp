#include "data/cache_key.h"

namespace dschat {
namespace data {

void hash_tokenizer_dir(Sha256& hash, const std::filesystem::path& dir) {
  static const char* const kFiles[] = {"tokenizer.json",        "vocab.json",
                                       "merges.txt",            "tokenizer_config.json",
                                       "special_tokens_map.json", "added_tokens.json",
                                       "tokenizer.model"};
  for (const char* name : kFiles) {
    const std::filesystem::path file = dir / name;
    // Hashed by name, not full path: the same tokenizer copied elsewhere reuses the cache.
    if (std::filesystem::is_regular_file(file)) hash.field(std::string("tokenizer.") + name, sha256_of_file(file));
  }
}

void hash_dataset(Sha256& hash, const std::string& role, const DatasetSpec& spec, const DatasetFiles& files) {
  hash.field(role + ".name", spec.name);
  if (spec.schema) {
    hash.field(role + ".schema", spec.schema->prompt_field + "\n" + spec.schema->chosen_field + "\n" +
                                     spec.schema->rejected_field + "\n" + spec.schema->format);
  }
  hash.field(role + ".train_files", static_cast<int64_t>(files.train.size()));
  for (const auto& file : files.train) hash.file(role + ".train", file);
  hash.field(role + ".eval_files", static_cast<int64_t>(files.eval.size()));
  for (const auto& file : files.eval) hash.file(role + ".eval", file);
}

}  // namespace data
}  // namespace dschat
