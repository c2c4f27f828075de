# CPU optimizer step: dschat's engine::AdamW vs LibTorch's torch::optim::AdamW (google benchmark).
find_package(benchmark REQUIRED)
add_executable(dschat_adamw_bench ${CMAKE_CURRENT_LIST_DIR}/adamw_bench.cpp)
target_link_libraries(dschat_adamw_bench PRIVATE dschat benchmark::benchmark)
target_compile_options(dschat_adamw_bench PRIVATE -Wall -Wextra)
