// The one test source compiled with the build's absolute paths (tests/CMakeLists.txt passes them
// as DSCHAT_BUILT_* definitions); see test_paths.h.
#include "test_paths.h"

namespace dschat {
namespace testing {

const BuildPaths& build_paths() {
  static const BuildPaths paths{DSCHAT_BUILT_SOURCE_DIR,   DSCHAT_BUILT_TEST_DATA_DIR,   DSCHAT_BUILT_PYTHON,
                                DSCHAT_BUILT_CLI,          DSCHAT_BUILT_BUILD_DIR,       DSCHAT_BUILT_DIST_WORKER,
                                DSCHAT_BUILT_TRAIN_WORKER, DSCHAT_BUILT_HYBRID_WORKER,   DSCHAT_BUILT_TP_WORKER,
                                DSCHAT_BUILT_GENERATE_WORKER};
  return paths;
}

}  // namespace testing
}  // namespace dschat
