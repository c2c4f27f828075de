// Links the installed libdschat, loads a model directory and prints the logits' shape.
#include <dschat/core/build_info.h>
#include <dschat/inference/model_loader.h>

#include <iostream>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: consumer MODEL_DIR\n";
    return 2;
  }
  try {
    auto model = dschat::inference::load_causal_lm(argv[1]);
    torch::NoGradGuard no_grad;
    torch::Tensor logits = model->forward(torch::tensor({{2, 10, 11, 12}}, torch::kInt64));  // [1, 4, V]
    std::cout << "dschat " << dschat::core::build_info().dschat_version << " logits " << logits.sizes() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "consumer: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
