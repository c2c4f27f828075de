// DeepSpeed's hostfile format (deepspeed/launcher/runner.py, fetch_hostfile): `hostname slots=N`
// per line, `#` comments, blank lines ignored; a duplicate host is an error.
#include <fstream>
#include <map>
#include <sstream>

#include "dschat/core/error.h"
#include "dschat/dist/launcher.h"

namespace dschat {
namespace dist {
namespace {

std::string strip_comment(const std::string& line) {
  size_t hash = line.find('#');
  return hash == std::string::npos ? line : line.substr(0, hash);
}

int64_t parse_slots(const std::string& field, const std::string& where) {
  const std::string value = field.substr(6);  // after "slots="
  size_t used = 0;
  int64_t slots = 0;
  try {
    slots = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  DSCHAT_CHECK(used == value.size() && used > 0 && slots >= 1, ConfigError, where, ": '", field,
               "': slots must be a positive integer");
  return slots;
}

}  // namespace

std::vector<HostfileEntry> parse_hostfile(const std::string& text, const std::string& source) {
  std::vector<HostfileEntry> entries;
  std::map<std::string, size_t> line_of_host;
  std::istringstream lines(text);
  size_t number = 0;
  for (std::string line; std::getline(lines, line);) {
    ++number;
    std::istringstream fields(strip_comment(line));
    std::vector<std::string> words;
    for (std::string word; fields >> word;) words.push_back(word);
    if (words.empty()) continue;
    const std::string where = source + " line " + std::to_string(number);
    DSCHAT_CHECK(words.size() >= 2 && words[1].rfind("slots=", 0) == 0, ConfigError, where, ": '", line,
                 "': expected 'hostname slots=N' (missing slots=N)");
    DSCHAT_CHECK(words.size() == 2, ConfigError, where, ": '", line,
                 "': expected 'hostname slots=N', got extra text after the slot count");
    const std::string& host = words[0];
    auto [it, inserted] = line_of_host.emplace(host, number);
    DSCHAT_CHECK(inserted, ConfigError, where, ": host '", host, "' is already listed on line ", it->second);
    entries.push_back({host, parse_slots(words[1], where)});
  }
  DSCHAT_CHECK(!entries.empty(), ConfigError, source, ": no hosts (expected lines 'hostname slots=N')");
  return entries;
}

std::vector<HostfileEntry> read_hostfile(const std::string& path) {
  std::ifstream in(path);
  DSCHAT_CHECK(in.good(), IoError, "hostfile ", path, ": cannot open file for reading");
  std::stringstream text;
  text << in.rdbuf();
  DSCHAT_CHECK(!in.bad(), IoError, "hostfile ", path, ": read failed");
  return parse_hostfile(text.str(), "hostfile " + path);
}

}  // namespace dist
}  // namespace dschat
