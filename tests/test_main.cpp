// GoogleTest main shared by the test binaries: fixed seeds, quiet logging unless asked.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dschat/core/logging.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (std::getenv("DSCHAT_LOG_LEVEL") == nullptr) {
    dschat::core::set_log_level(dschat::core::LogLevel::Warn);
  }
  torch::manual_seed(1234);
  torch::set_num_threads(2);
  return RUN_ALL_TESTS();
}
