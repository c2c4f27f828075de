#include "commands.h"
namespace dschat { namespace cli {
void add_forward_command(CLI::App&) {}
void add_generate_command(CLI::App&) {}
}}
