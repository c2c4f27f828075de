// Links the installed libdschat, loads a model directory (config.json + model.safetensors) and
// prints the logits' shape of one forward pass.   hello_model MODEL_DIR
#include <dschat/core/build_info.h>
#include <dschat/models/load_save.h>

#include <iostream>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: hello_model MODEL_DIR\n";
    return 2;
  }
  try {
    auto model = dschat::models::load_causal_lm(argv[1]);
    torch::NoGradGuard no_grad;
    torch::Tensor logits = model->forward(torch::tensor({{2, 10, 11, 12}}, torch::kInt64));  // [1, 4, V]
    std::cout << "dschat " << dschat::core::build_info().dschat_version << " logits " << logits.sizes() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "hello_model: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
