# A decode step's attention on the CPU: ops::decode_attention's loop against its ATen reference
# (MKL's gemv per head) on OPT-125m's heads. Built, never run by ctest.
add_executable(dschat_decode_attention_bench ${CMAKE_CURRENT_LIST_DIR}/decode_attention_bench.cpp)
target_link_libraries(dschat_decode_attention_bench PRIVATE dschat CLI11::CLI11)
target_compile_options(dschat_decode_attention_bench PRIVATE -Wall -Wextra)
target_precompile_headers(dschat_decode_attention_bench REUSE_FROM dschat_cli)
