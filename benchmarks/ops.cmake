add_executable(dschat_rms_norm_bench ${CMAKE_CURRENT_LIST_DIR}/rms_norm_bench.cpp)
target_link_libraries(dschat_rms_norm_bench PRIVATE dschat CLI11::CLI11)
target_precompile_headers(dschat_rms_norm_bench REUSE_FROM dschat_cli)

add_executable(dschat_top_p_bench ${CMAKE_CURRENT_LIST_DIR}/top_p_bench.cpp)
target_link_libraries(dschat_top_p_bench PRIVATE dschat CLI11::CLI11)
target_precompile_headers(dschat_top_p_bench REUSE_FROM dschat_cli)

# JSON mode's mask lives in src/serve (private to the library): the bench reads its header there.
add_executable(dschat_json_mode_bench ${CMAKE_CURRENT_LIST_DIR}/json_mode_bench.cpp)
target_link_libraries(dschat_json_mode_bench PRIVATE dschat CLI11::CLI11)
target_include_directories(dschat_json_mode_bench PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_compile_definitions(dschat_json_mode_bench PRIVATE DSCHAT_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
target_precompile_headers(dschat_json_mode_bench REUSE_FROM dschat_cli)
