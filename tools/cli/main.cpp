// `dschat`: the command-line front end of libdschat. Errors from the library are printed on
// stderr as one line "dschat: error: <message>" with exit status 1; usage errors exit with 2; a
// run the training guardian stopped (after saving a checkpoint) exits with 3; Ctrl-C with 130.
#include <iostream>

#include "commands.h"
#include "usage_check.h"
#include "dschat/core/error.h"
#include "dschat/core/host_memory.h"
#include "dschat/monitor/guardian.h"
#include "dschat/rlhf/config/step_context.h"

int main(int argc, char** argv) {
  dschat::core::retain_freed_host_memory();  // training loops reuse their large host blocks
  CLI::App app{"dschat: DeepSpeed-Chat in C++ (SFT, reward model, PPO on LibTorch)", "dschat"};
  app.require_subcommand(1);
  dschat::cli::add_info_command(app);
  dschat::cli::add_forward_command(app);
  dschat::cli::add_generate_command(app);
  dschat::cli::add_chat_command(app);
  dschat::cli::add_tokenize_command(app);
  dschat::cli::add_make_demo_data_command(app);
  dschat::cli::add_launch_command(app);
  dschat::cli::add_export_command(app);
  dschat::cli::add_ckpt_command(app);
  dschat::cli::add_plot_command(app);
  dschat::cli::add_train_commands(app);
  dschat::cli::add_plan_command(app);
  dschat::cli::add_serve_command(app);
  // An unknown command or flag, named with the nearest known one (CLI11 would report something else first).
  if (const std::string usage = dschat::cli::find_usage_error(app, argc, argv); !usage.empty()) {
    std::cerr << "dschat: error: " << usage << "\n";
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const dschat::rlhf::Interrupted& e) {  // a stop request, answered with a saved checkpoint
    std::cerr << "dschat: " << e.what() << "\n";
    return 130;
  } catch (const dschat::monitor::GuardianStop& e) {  // a failing run, stopped with a checkpoint
    std::cerr << "dschat: " << e.what() << "\n";
    return 3;
  } catch (const dschat::core::Error& e) {
    std::cerr << "dschat: error: " << e.what() << "\n";
    return 1;
  } catch (const c10::Error& e) {
    std::cerr << "dschat: error: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "dschat: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
