# Tokenizer throughput benchmark (benchmarks/tokenizer_bench.py drives it against HF tokenizers).
find_package(nlohmann_json 3 REQUIRED)
add_executable(dschat_tokenizer_bench ${CMAKE_CURRENT_LIST_DIR}/tokenizer_bench.cpp)
target_link_libraries(dschat_tokenizer_bench PRIVATE dschat nlohmann_json::nlohmann_json)
target_compile_options(dschat_tokenizer_bench PRIVATE -Wall -Wextra)
