#include "dschat/io/model_source.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <regex>

#include "core/env.h"
#include "core/strings.h"
#include "dschat/core/error.h"

namespace dschat {
namespace io {
namespace fs = std::filesystem;

namespace {

bool has_config(const fs::path& dir) { return fs::is_regular_file(dir / "config.json"); }

}  // namespace

std::vector<fs::path> hf_cache_roots() {
  std::vector<fs::path> roots;
  if (auto hub = core::read_string_from_env("HF_HUB_CACHE")) roots.emplace_back(*hub);
  if (auto home = core::read_string_from_env("HF_HOME")) roots.push_back(fs::path(*home) / "hub");
  if (auto xdg = core::read_string_from_env("XDG_CACHE_HOME")) roots.push_back(fs::path(*xdg) / "huggingface" / "hub");
  if (auto user = core::read_string_from_env("HOME")) roots.push_back(fs::path(*user) / ".cache" / "huggingface" / "hub");
  return roots;
}

// <kind>--org--name/snapshots/<hash>: the hash refs/main names, else the newest accepted snapshot.
std::optional<fs::path> find_cached_snapshot(const std::string& kind, const std::string& repo_id,
                                             const std::function<bool(const fs::path&)>& accept,
                                             std::vector<std::string>* searched) {
  const std::string folder = kind + "--" + std::regex_replace(repo_id, std::regex("/"), "--");
  for (const auto& root : hf_cache_roots()) {
    fs::path repo = root / folder;
    std::error_code ec;
    std::ifstream ref(repo / "refs" / "main");
    std::string hash;
    if (ref && std::getline(ref, hash) && !hash.empty()) {
      fs::path snapshot = repo / "snapshots" / hash;
      searched->push_back(snapshot.string());
      if (accept(snapshot)) return snapshot;
    }
    fs::path snapshots = repo / "snapshots";
    searched->push_back(snapshots.string() + "/*");
    std::optional<fs::path> newest;
    fs::file_time_type newest_time;
    if (fs::is_directory(snapshots, ec)) {
      for (const auto& entry : fs::directory_iterator(snapshots, ec)) {
        if (!accept(entry.path())) continue;
        auto time = fs::last_write_time(entry.path(), ec);
        if (!newest || time > newest_time) {
          newest = entry.path();
          newest_time = time;
        }
      }
    }
    if (newest) return newest;
  }
  return std::nullopt;
}

std::string expand_short_model_name(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  static const std::regex opt("opt-[0-9.]+[mb]", std::regex::icase);
  static const std::regex llama2("llama-2-([0-9]+)b(-chat)?", std::regex::icase);
  // The families of DeepSpeed-Chat's README and today's starting points, by their hub ids' casing.
  static const std::regex gpt2("gpt2(-medium|-large|-xl)?", std::regex::icase);
  static const std::regex eleuther("(pythia-[0-9.]+[mb](-deduped)?|gpt-neo-[0-9.]+[mb]|gpt-j-6b|gpt-neox-20b)",
                                   std::regex::icase);
  static const std::regex bloom("bloomz?-[0-9a-z.]+", std::regex::icase);
  static const std::regex codegen("codegen-([0-9.]+)([mb])-(mono|multi|nl)", std::regex::icase);
  static const std::regex qwen("qwen(2\\.5|2|3)-([0-9.]+)([mb])(-instruct|-base)?", std::regex::icase);
  static const std::regex mistral("mistral-7b(-instruct)?-(v0\\.[0-9])", std::regex::icase);
  auto lower = [](std::string text) {
    for (auto& ch : text) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return text;
  };
  auto upper = [](std::string text) {
    for (auto& ch : text) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    return text;
  };
  std::smatch match;
  if (std::regex_match(name, opt)) return "facebook/" + name;
  if (std::regex_match(name, match, llama2)) {
    return "meta-llama/Llama-2-" + match[1].str() + "b" + (match[2].matched ? "-chat" : "") + "-hf";
  }
  if (std::regex_match(name, gpt2)) return "openai-community/" + lower(name);
  if (std::regex_match(name, eleuther)) return "EleutherAI/" + lower(name);
  if (std::regex_match(name, bloom)) return "bigscience/" + lower(name);
  if (std::regex_match(name, match, codegen)) {
    return "Salesforce/codegen-" + match[1].str() + upper(match[2].str()) + "-" + lower(match[3].str());
  }
  if (std::regex_match(name, match, qwen)) {  // Qwen/Qwen2.5-0.5B-Instruct, Qwen/Qwen3-8B-Base
    const std::string variant = lower(match[4].str());
    return "Qwen/Qwen" + match[1].str() + "-" + match[2].str() + upper(match[3].str()) +
           (variant == "-instruct" ? "-Instruct" : variant == "-base" ? "-Base" : "");
  }
  if (std::regex_match(name, match, mistral)) {
    return std::string("mistralai/Mistral-7B") + (match[1].matched ? "-Instruct" : "") + "-" + lower(match[2].str());
  }
  return name;
}

fs::path resolve_model_dir(const std::string& name_or_path) {
  DSCHAT_CHECK(!name_or_path.empty(), InvalidArgument, "model: empty model name or path");
  std::vector<std::string> searched;
  fs::path local(name_or_path);
  searched.push_back(fs::absolute(local).string());
  if (has_config(local)) return local;
  DSCHAT_CHECK(!fs::is_directory(local), NotFound, "model directory ", local.string(),
               " has no config.json (a Hugging Face model directory needs one)");
  for (const std::string& repo_id : {name_or_path, expand_short_model_name(name_or_path)}) {
    if (repo_id.find('/') == std::string::npos) continue;
    if (auto snapshot = find_cached_snapshot("models", repo_id, has_config, &searched)) return *snapshot;
  }
  searched.erase(std::unique(searched.begin(), searched.end()), searched.end());  // name == its expansion
  const std::string repo = expand_short_model_name(name_or_path);
  std::string cache_dir = "models--" + repo;
  for (size_t slash = cache_dir.find('/'); slash != std::string::npos; slash = cache_dir.find('/')) {
    cache_dir.replace(slash, 1, "--");
  }
  DSCHAT_THROW(NotFound, "model '", name_or_path, "' not found (nothing is downloaded; searched: ",
               core::join(searched), "). Put it in one of: a local directory given as the path, holding config.json, ",
               "the weights (model.safetensors, or model-*-of-*.safetensors with model.safetensors.index.json, or ",
               "pytorch_model.bin) and the tokenizer (tokenizer.json, or vocab.json and merges.txt); or the Hugging ",
               "Face cache, $HF_HUB_CACHE or $HF_HOME/hub or ~/.cache/huggingface/hub, as ", cache_dir,
               "/snapshots/<revision>/ (what `huggingface-cli download ", repo, "` writes on a machine with network). ",
               "Training from random weights of its shape needs no files: --init random");
}

}  // namespace io
}  // namespace dschat
