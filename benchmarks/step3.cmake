# Step-3 (PPO) iteration throughput: dschat's trainer pieces vs the same iteration in transformers +
# PyTorch (benchmarks/step3_bench_peer.py, run by the binary itself). Built, never run by ctest.
find_package(nlohmann_json 3 REQUIRED)
add_executable(dschat_step3_bench ${CMAKE_CURRENT_LIST_DIR}/step3_bench.cpp)
target_link_libraries(dschat_step3_bench PRIVATE dschat CLI11::CLI11 nlohmann_json::nlohmann_json)
target_include_directories(dschat_step3_bench PRIVATE ${PROJECT_SOURCE_DIR}/src)  # the trainer's pieces
target_compile_definitions(dschat_step3_bench PRIVATE DSCHAT_BENCH_PYTHON="${DSCHAT_PYTHON}"
                           DSCHAT_BENCH_PEER="${CMAKE_CURRENT_LIST_DIR}/step3_bench_peer.py")
target_compile_options(dschat_step3_bench PRIVATE -Wall -Wextra)
target_precompile_headers(dschat_step3_bench REUSE_FROM dschat_cli)
