#pragma once
// Usage errors CLI11 reports poorly, caught before it parses: an unknown subcommand ("dschat
// trian": CLI11 says only "A subcommand is required") and an unknown flag ("dschat sft --modle x":
// CLI11 reports the missing required --model first and never names --modle). Each gets one
// message naming the word and the nearest known one.

#include <CLI/CLI.hpp>

#include <string>

namespace dschat {
namespace cli {

/// "" when every command word and flag of argv is known to `app`, else the message.
std::string find_usage_error(const CLI::App& app, int argc, const char* const* argv);

}  // namespace cli
}  // namespace dschat
