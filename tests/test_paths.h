#pragma once
// Where this build put things (the source tree, the CLI, the worker binaries, the venv's Python),
// as values read at run time. Only tests/test_paths.cpp is compiled with these absolute paths, so
// every other test file compiles to the same bytes in any checkout and ccache hits from a fresh
// clone in another folder (CI's case).

namespace dschat {
namespace testing {

struct BuildPaths {
  const char* source_dir;
  const char* test_data_dir;  // tests/fixtures
  const char* python;         // the project venv's Python
  const char* cli;            // the dschat binary
  const char* build_dir;
  const char* dist_worker;
  const char* train_worker;
  const char* hybrid_worker;
  const char* tp_worker;
  const char* generate_worker;
};

const BuildPaths& build_paths();

}  // namespace testing
}  // namespace dschat

#define DSCHAT_SOURCE_DIR (::dschat::testing::build_paths().source_dir)
#define DSCHAT_TEST_DATA_DIR (::dschat::testing::build_paths().test_data_dir)
#define DSCHAT_PYTHON (::dschat::testing::build_paths().python)
#define DSCHAT_CLI_PATH (::dschat::testing::build_paths().cli)
#define DSCHAT_BUILD_DIR (::dschat::testing::build_paths().build_dir)
#define DSCHAT_DIST_WORKER_PATH (::dschat::testing::build_paths().dist_worker)
#define DSCHAT_TRAIN_WORKER_PATH (::dschat::testing::build_paths().train_worker)
#define DSCHAT_HYBRID_WORKER_PATH (::dschat::testing::build_paths().hybrid_worker)
#define DSCHAT_TP_WORKER_PATH (::dschat::testing::build_paths().tp_worker)
#define DSCHAT_GENERATE_WORKER_PATH (::dschat::testing::build_paths().generate_worker)
