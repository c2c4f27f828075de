add_executable(dschat_rms_norm_bench ${CMAKE_CURRENT_LIST_DIR}/rms_norm_bench.cpp)
target_link_libraries(dschat_rms_norm_bench PRIVATE dschat CLI11::CLI11)
target_precompile_headers(dschat_rms_norm_bench REUSE_FROM dschat_cli)

add_executable(dschat_top_p_bench ${CMAKE_CURRENT_LIST_DIR}/top_p_bench.cpp)
target_link_libraries(dschat_top_p_bench PRIVATE dschat CLI11::CLI11)
target_precompile_headers(dschat_top_p_bench REUSE_FROM dschat_cli)
