#include "usage_check.h"

#include <vector>

#include "dschat/core/names.h"

namespace dschat {
namespace cli {
namespace {

// A flag word: "--name", "--name=value", "-n"; not a negative number ("-1e-5") nor "-" / "--".
bool is_flag(const std::string& word) {
  if (word.size() < 2 || word[0] != '-' || word == "--") return false;
  const char next = word[1] == '-' ? (word.size() > 2 ? word[2] : '\0') : word[1];
  return std::isalpha(static_cast<unsigned char>(next)) != 0;
}

std::string path_of(const CLI::App* app) {
  std::string path;
  for (const CLI::App* at = app; at != nullptr; at = at->get_parent()) {
    path = at->get_name() + (path.empty() ? "" : " " + path);
  }
  return path;
}

// The flag names `app` and its parents take ("--model", "-h", ...).
std::vector<std::string> flags_of(const CLI::App* app) {
  std::vector<std::string> names;
  for (const CLI::App* at = app; at != nullptr; at = at->get_parent()) {
    for (const CLI::Option* option : at->get_options()) {
      for (const std::string& name : option->get_lnames()) names.push_back("--" + name);
      for (const std::string& name : option->get_snames()) names.push_back("-" + name);
    }
  }
  return names;
}

bool takes_flag(const CLI::App* app, const std::string& flag) {
  for (const std::string& name : flags_of(app)) {
    if (name == flag) return true;
  }
  return false;
}

std::vector<std::string> subcommand_names(const CLI::App* app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app->get_subcommands([](const CLI::App*) { return true; })) names.push_back(sub->get_name());
  return names;
}

std::string suggestion(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string nearest = core::nearest_name(word, candidates);
  return nearest.empty() ? "" : "; did you mean '" + nearest + "'?";
}

}  // namespace

std::string find_usage_error(const CLI::App& app, int argc, const char* const* argv) {
  const CLI::App* current = &app;
  bool expects_command = true;  // the word right after a command's name names its subcommand
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--") break;  // the rest are values
    if (is_flag(word)) {
      const std::string flag = word.substr(0, word.find('='));
      if (flag == "--help" || flag == "-h") return "";  // CLI11 prints the help
      // Single-dash words may be bundled short flags or values: only long flags are checked.
      if (flag.rfind("--", 0) == 0 && !takes_flag(current, flag)) {
        return "unknown flag '" + flag + "' for '" + path_of(current) + "'" + suggestion(flag, flags_of(current)) +
               " (" + path_of(current) + " --help lists them)";
      }
      expects_command = false;  // the next word may be this flag's value
      continue;
    }
    const std::vector<std::string> commands = subcommand_names(current);
    if (commands.empty()) continue;  // a value or a positional argument
    bool found = false;
    for (const CLI::App* sub : current->get_subcommands([](const CLI::App*) { return true; })) {
      if (sub->check_name(word)) {
        current = sub;
        found = true;
        break;
      }
    }
    if (!found && expects_command && current->get_require_subcommand_min() > 0) {
      return "unknown command '" + word + "' for '" + path_of(current) + "'" + suggestion(word, commands) + " (" +
             path_of(current) + " --help lists them)";
    }
    expects_command = found;
  }
  return "";
}

}  // namespace cli
}  // namespace dschat
