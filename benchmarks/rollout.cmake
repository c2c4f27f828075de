# RLVR-shaped rollouts on the CPU: n samples per prompt with skewed answer lengths, dschat's static
# InferenceEngine against transformers' generate. Built, never run by ctest.
add_executable(dschat_rollout_bench ${CMAKE_CURRENT_LIST_DIR}/rollout_bench.cpp)
target_link_libraries(dschat_rollout_bench PRIVATE dschat CLI11::CLI11 nlohmann_json::nlohmann_json)
target_compile_options(dschat_rollout_bench PRIVATE -Wall -Wextra)
target_compile_definitions(dschat_rollout_bench PRIVATE
  DSCHAT_BENCH_PYTHON="${DSCHAT_PYTHON}" DSCHAT_BENCH_PEER="${CMAKE_CURRENT_LIST_DIR}/rollout_bench_peer.py")
target_precompile_headers(dschat_rollout_bench REUSE_FROM dschat_cli)
