# Decode bandwidth on a GPU: dschat's InferenceEngine decode step against the memory-bandwidth
# limit, eager and CUDA-graph, at several batch sizes. Built, never run by ctest.
find_package(nlohmann_json 3 REQUIRED)
add_executable(dschat_decode_bench ${CMAKE_CURRENT_LIST_DIR}/decode_bench.cpp)
target_link_libraries(dschat_decode_bench PRIVATE dschat CLI11::CLI11 nlohmann_json::nlohmann_json)
target_compile_options(dschat_decode_bench PRIVATE -Wall -Wextra)
target_precompile_headers(dschat_decode_bench REUSE_FROM dschat_cli)
