# Training-step throughput and ZeRO memory on the CPU: dschat's TrainingEngine vs PyTorch eager and
# DDP (benchmarks/train_step_peer.py, run by the binary itself). Built, never run by ctest.
find_package(nlohmann_json 3 REQUIRED)
add_executable(dschat_train_step_bench ${CMAKE_CURRENT_LIST_DIR}/train_step_bench.cpp)
target_link_libraries(dschat_train_step_bench PRIVATE dschat CLI11::CLI11 nlohmann_json::nlohmann_json)
target_compile_definitions(dschat_train_step_bench PRIVATE DSCHAT_BENCH_PYTHON="${DSCHAT_PYTHON}"
                           DSCHAT_BENCH_PEER="${CMAKE_CURRENT_LIST_DIR}/train_step_peer.py")
target_compile_options(dschat_train_step_bench PRIVATE -Wall -Wextra)
target_precompile_headers(dschat_train_step_bench REUSE_FROM dschat_cli)
