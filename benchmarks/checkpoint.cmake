# Training stall per checkpoint save: synchronous against asynchronous (background) saves of
# TrainingEngine, in one run. Built, never run by ctest.
find_package(nlohmann_json 3 REQUIRED)
add_executable(dschat_checkpoint_bench ${CMAKE_CURRENT_LIST_DIR}/checkpoint_bench.cpp)
target_link_libraries(dschat_checkpoint_bench PRIVATE dschat CLI11::CLI11 nlohmann_json::nlohmann_json)
target_include_directories(dschat_checkpoint_bench PRIVATE ${PROJECT_SOURCE_DIR}/src)  # io::remove_directory_tree
target_compile_options(dschat_checkpoint_bench PRIVATE -Wall -Wextra)
target_precompile_headers(dschat_checkpoint_bench REUSE_FROM dschat_cli)
