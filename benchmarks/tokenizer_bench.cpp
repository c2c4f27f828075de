// Tokenizer throughput: encodes every line of a corpus file `--repeat` times and prints one JSON
// object on stdout with MB/s (corpus bytes, not counting newlines, per second).
//   dschat_tokenizer_bench --tokenizer DIR --corpus FILE [--repeat N] [--threads T]
// --threads 1 calls encode() line by line on one thread; T > 1 uses encode_batch with T threads.
// One untimed pass first fills the word cache, as a long-running data pipeline would have it.
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "dschat/core/error.h"
#include "dschat/tokenizer/tokenizer.h"

namespace {

struct Args {
  std::string tokenizer, corpus;
  int repeat = 3;
  size_t threads = 1;
};

Args parse_args(int argc, char** argv) {
  Args args;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string key = argv[i], value = argv[i + 1];
    if (key == "--tokenizer") {
      args.tokenizer = value;
    } else if (key == "--corpus") {
      args.corpus = value;
    } else if (key == "--repeat") {
      args.repeat = std::stoi(value);
    } else if (key == "--threads") {
      args.threads = std::stoul(value);
    } else {
      DSCHAT_THROW(InvalidArgument, "unknown argument '", key, "'");
    }
  }
  DSCHAT_CHECK(!args.tokenizer.empty() && !args.corpus.empty() && args.repeat > 0 && args.threads > 0,
               InvalidArgument, "usage: tokenizer_bench --tokenizer DIR --corpus FILE [--repeat N] [--threads T]");
  return args;
}

size_t encode_all(const dschat::tokenizer::Tokenizer& tok, const std::vector<std::string>& lines, size_t threads) {
  size_t tokens = 0;
  if (threads == 1) {
    for (const std::string& line : lines) tokens += tok.encode(line, false).size();
    return tokens;
  }
  dschat::tokenizer::BatchOptions options;
  options.add_special_tokens = false;
  options.padding = dschat::tokenizer::Padding::kNone;
  options.num_threads = threads;
  for (const auto& row : tok.encode_batch(lines, options).input_ids) tokens += row.size();
  return tokens;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args args = parse_args(argc, argv);
    std::ifstream in(args.corpus, std::ios::binary);
    DSCHAT_CHECK(in.good(), IoError, args.corpus, ": cannot open corpus");
    std::vector<std::string> lines;
    size_t bytes = 0;
    for (std::string line; std::getline(in, line);) {
      bytes += line.size();
      lines.push_back(std::move(line));
    }
    auto load_start = std::chrono::steady_clock::now();
    auto tok = dschat::tokenizer::Tokenizer::load(args.tokenizer);
    double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();

    size_t tokens = encode_all(tok, lines, args.threads);  // warm-up
    auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < args.repeat; ++r) tokens = encode_all(tok, lines, args.threads);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    nlohmann::json result = {{"impl", "dschat"},
                             {"mode", args.threads == 1 ? "encode, 1 thread" : "encode_batch"},
                             {"threads", args.threads},
                             {"lines", lines.size()},
                             {"bytes", bytes},
                             {"tokens", tokens},
                             {"repeat", args.repeat},
                             {"load_s", load_s},
                             {"seconds", seconds},
                             {"mb_per_s", bytes * static_cast<double>(args.repeat) / seconds / 1e6}};
    std::cout << result.dump() << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "tokenizer_bench: error: " << e.what() << "\n";
    return 1;
  }
}
