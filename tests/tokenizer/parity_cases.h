#pragma once
// Case sets written by the Python oracles (make_tokenizer_cases.py, make_family_cases.py): a
// manifest of {"name", "dir", "cases"} and JSON Lines of texts with the ids and decodings that
// Hugging Face computed. Shared by the parity tests.

#include <nlohmann/json.hpp>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "dschat/tokenizer/tokenizer.h"
#include "test_util.h"

namespace dschat {
namespace tokenizer {
namespace parity {

struct CaseSet {
  std::string name;
  std::string dir;
  std::vector<nlohmann::json> lines;
};

inline std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

inline std::string show(const std::vector<int64_t>& ids) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < ids.size(); ++i) out << (i ? ", " : "") << ids[i];
  return out.str() + "]";
}

/// Every set listed in `manifest_path`, with its lines.
inline std::vector<CaseSet> load_sets(const std::filesystem::path& manifest_path) {
  std::vector<CaseSet> sets;
  std::ifstream manifest(manifest_path);
  for (const auto& entry : nlohmann::json::parse(manifest)) {
    CaseSet set{entry["name"], entry["dir"], {}};
    std::ifstream in(entry["cases"].get<std::string>());
    std::string line;
    while (std::getline(in, line)) set.lines.push_back(nlohmann::json::parse(line));
    sets.push_back(std::move(set));
  }
  return sets;
}

/// The case sets one oracle script (tests/tokenizer/<script>) writes into a temp dir, made once
/// per test suite: start() in SetUpTestSuite, stop() in TearDownTestSuite.
class OracleRun {
 public:
  void start(const std::string& script) {
    script_ = script;
    dir_ = std::make_unique<testing::TempDir>();
    const std::filesystem::path out = this->out();
    const std::string command = std::string(DSCHAT_PYTHON) + " " +
                                (testing::source_dir() / "tests/tokenizer" / script).string() + " --gpt2 " +
                                (testing::source_dir() / "assets/gpt2-bpe").string() + " --out " + out.string();
    status_ = testing::run_command(command, &output_);
    if (status_ == 0) sets_ = load_sets(out / "manifest.json");
  }
  void stop() {
    sets_.clear();
    dir_.reset();
  }
  /// Where the script wrote (its other files beside the case sets), its exit status and output.
  std::filesystem::path out() const { return dir_->path() / "cases"; }
  int status() const { return status_; }
  const std::string& output() const { return output_; }
  /// The set called `name` (a test failure, and an empty set, when the script failed or lacks it).
  const CaseSet& set(const std::string& name) const {
    EXPECT_EQ(status_, 0) << script_ << " failed:\n" << output_;
    for (const CaseSet& s : sets_) {
      if (s.name == name) return s;
    }
    static const CaseSet empty;
    ADD_FAILURE() << "no case set '" << name << "'";
    return empty;
  }

 private:
  std::string script_;
  std::unique_ptr<testing::TempDir> dir_;
  int status_ = -1;
  std::string output_;
  std::vector<CaseSet> sets_;
};

/// Compares encode (with and without special tokens) and decode (with and without
/// skip_special_tokens) of every line; reports the first mismatches. Returns the number of
/// encoded strings compared.
inline size_t check_set(const CaseSet& cases, size_t min_cases) {
  if (cases.lines.empty()) return 0;
  Tokenizer tok = Tokenizer::load(cases.dir);
  size_t compared = 0, mismatches = 0;
  auto report = [&](const std::string& what, const nlohmann::json& line, const std::string& got) {
    if (++mismatches <= 5) ADD_FAILURE() << cases.name << ": " << what << " differs for " << line.dump() << "\n  got " << got;
  };
  for (const nlohmann::json& line : cases.lines) {
    std::vector<int64_t> ids;
    if (line.contains("decode_ids")) {
      ids = line["decode_ids"].get<std::vector<int64_t>>();
    } else {
      std::string text = line.contains("bytes_hex") ? from_hex(line["bytes_hex"]) : line["text"].get<std::string>();
      ids = line["ids"].get<std::vector<int64_t>>();
      std::vector<int64_t> got = tok.encode(text, true);
      if (got != ids) report("encode", line, show(got));
      std::vector<int64_t> got_plain = tok.encode(text, false);
      if (got_plain != line["ids_plain"].get<std::vector<int64_t>>()) report("encode (no specials)", line, show(got_plain));
      ++compared;
    }
    std::string decoded = tok.decode(ids, false);
    if (decoded != line["decoded"].get<std::string>()) report("decode", line, nlohmann::json(decoded).dump());
    std::string skipped = tok.decode(ids, true);
    if (skipped != line["decoded_skip"].get<std::string>()) report("decode (skip special)", line, nlohmann::json(skipped).dump());
  }
  EXPECT_EQ(mismatches, 0u) << cases.name;
  EXPECT_GE(compared, min_cases) << cases.name;
  return compared;
}

/// decode(encode(text)) == text for every line with a text (no special tokens added); reports the
/// first failures. Returns the number of texts checked.
inline size_t check_round_trip(const CaseSet& cases, size_t min_checked) {
  if (cases.lines.empty()) return 0;
  Tokenizer tok = Tokenizer::load(cases.dir);
  size_t failures = 0, checked = 0;
  for (const nlohmann::json& line : cases.lines) {
    if (!line.contains("text")) continue;
    const std::string text = line["text"];
    const std::string back = tok.decode(tok.encode(text, false));
    ++checked;
    if (back != text && ++failures <= 5) {
      ADD_FAILURE() << cases.name << ": round trip of " << line["text"].dump() << " gave " << back;
    }
  }
  EXPECT_EQ(failures, 0u) << cases.name;
  EXPECT_GE(checked, min_checked) << cases.name;
  return checked;
}

}  // namespace parity
}  // namespace tokenizer
}  // namespace dschat
