# Greedy generation throughput on the CPU: dschat's InferenceEngine vs transformers' generate()
# (benchmarks/generate_bench_peer.py, run by the binary itself). Built, never run by ctest.
find_package(nlohmann_json 3 REQUIRED)
add_executable(dschat_generate_bench ${CMAKE_CURRENT_LIST_DIR}/generate_bench.cpp)
target_link_libraries(dschat_generate_bench PRIVATE dschat CLI11::CLI11 nlohmann_json::nlohmann_json)
target_compile_definitions(dschat_generate_bench PRIVATE DSCHAT_BENCH_PYTHON="${DSCHAT_PYTHON}"
                           DSCHAT_BENCH_PEER="${CMAKE_CURRENT_LIST_DIR}/generate_bench_peer.py")
target_compile_options(dschat_generate_bench PRIVATE -Wall -Wextra)
target_precompile_headers(dschat_generate_bench REUSE_FROM dschat_cli)
