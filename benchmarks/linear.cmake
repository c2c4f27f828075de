# The decode GEMM on the CPU: ops::linear's skinny kernel against at::linear (MKL) on OPT-125m's
# shapes at few rows. Built, never run by ctest.
add_executable(dschat_linear_bench ${CMAKE_CURRENT_LIST_DIR}/linear_bench.cpp)
target_link_libraries(dschat_linear_bench PRIVATE dschat CLI11::CLI11)
target_compile_options(dschat_linear_bench PRIVATE -Wall -Wextra)
target_precompile_headers(dschat_linear_bench REUSE_FROM dschat_cli)
