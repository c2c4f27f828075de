#include "dschat/data/unsupervised.h"

#include <thread>

#include "core/log.h"
#include "data/cache_key.h"
#include "data/row_table.h"
#include "dschat/core/error.h"
#include "dschat/data/raw_dataset.h"
#include "dschat/tokenizer/tokenizer.h"

namespace dschat {
namespace data {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> train_files(const std::string& path) {
  if (fs::is_regular_file(path)) return {path};
  DatasetSpec spec{path, GenericSchema{}};
  return locate_dataset(spec, RawDatasetOptions{}).train;
}

std::vector<std::string> read_texts(const std::vector<fs::path>& files, const UnsupervisedDataOptions& options) {
  std::vector<std::string> texts;
  for (const auto& file : files) {
    RowTable table = read_rows(file, options.skip_bad_records);
    for (size_t i = 0; i < table.rows.size(); ++i) {
      auto it = table.rows[i].find(options.text_field);
      if (it != table.rows[i].end() && it->is_string()) {
        texts.push_back(it->get<std::string>());
        continue;
      }
      DSCHAT_CHECK(options.skip_bad_records, FormatError, table.where(i), ": no string field '",
                   options.text_field, "' (set text_field to the column holding the text)");
    }
  }
  return texts;
}

}  // namespace

TokenizedDataset create_unsupervised_dataset(const UnsupervisedDataOptions& options,
                                             const tokenizer::Tokenizer& tokenizer) {
  DSCHAT_CHECK(!options.paths.empty(), ConfigError, "unsupervised data: no paths given");
  DSCHAT_CHECK(options.block_size >= 1, ConfigError, "unsupervised data: block_size ", options.block_size,
               " must be >= 1");
  std::vector<fs::path> files;
  for (const auto& path : options.paths) {
    for (auto& file : train_files(path)) files.push_back(std::move(file));
  }
  fs::path cache_file;
  if (!options.cache_dir.empty()) {
    Sha256 hash;
    hash.field("version", kCacheFormatVersion);
    hash.field("kind", "unsupervised");
    hash.field("block_size", options.block_size);
    hash.field("text_field", options.text_field);
    hash.field("skip_bad_records", options.skip_bad_records ? 1 : 0);
    hash.field("files", static_cast<int64_t>(files.size()));
    for (const auto& file : files) hash.file("file", file);
    hash_tokenizer_dir(hash, tokenizer.directory());
    cache_file = options.cache_dir / ("unsupdata_" + hash.hex() + ".dstok");
    if (fs::is_regular_file(cache_file)) {
      try {
        return TokenizedDataset::load(cache_file);
      } catch (const core::FormatError& e) {
        core::log_warn("ignoring a corrupt data cache entry, rebuilding: ", e.what());
      }
    }
  }

  tokenizer::BatchOptions batch;
  batch.padding = tokenizer::Padding::kNone;
  batch.num_threads = options.num_threads ? options.num_threads : std::max(1u, std::thread::hardware_concurrency());
  auto encoded = tokenizer.encode_batch(read_texts(files, options), batch);
  std::vector<int64_t> stream;
  for (const auto& ids : encoded.input_ids) stream.insert(stream.end(), ids.begin(), ids.end());
  const int64_t blocks = static_cast<int64_t>(stream.size()) / options.block_size;
  DSCHAT_CHECK(blocks > 0, InvalidArgument, "unsupervised data: ", stream.size(),
               " tokens in all, less than one block of ", options.block_size);
  TokenizedDataset out(PhaseKind::kSft);
  std::vector<int64_t> block(options.block_size);
  for (int64_t b = 0; b < blocks; ++b) {
    std::copy(stream.begin() + b * options.block_size, stream.begin() + (b + 1) * options.block_size, block.begin());
    out.append({&block});
  }
  out.metadata()["texts"] = encoded.input_ids.size();
  out.metadata()["tokens_dropped"] = static_cast<int64_t>(stream.size()) - blocks * options.block_size;
  core::log_info("unsupervised data: ", blocks, " blocks of ", options.block_size, " tokens from ",
                 encoded.input_ids.size(), " texts");
  if (!cache_file.empty()) {
    std::error_code ec;
    fs::create_directories(options.cache_dir, ec);
    DSCHAT_CHECK(!ec, IoError, "data cache dir ", options.cache_dir.string(), ": ", ec.message());
    out.save(cache_file);
  }
  return out;
}

}  // namespace data
}  // namespace dschat
