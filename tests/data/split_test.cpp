// DeepSpeed-Chat's phase split against NumPy: the legacy RandomState shuffle and the boundary
// arithmetic (run in Python at test time through the project venv), plus the documented example.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "dschat/data/split.h"
#include "test_util.h"

namespace dschat {
namespace {

TEST(DataSplit, DocumentedRmStaticBoundaries) {
  auto weights = data::parse_data_split("2,4,4");
  EXPECT_EQ(data::split_boundaries(weights, 76256), (std::vector<int64_t>{0, 15252, 45754, 76256}));
  EXPECT_EQ(data::split_boundaries(weights, 5103), (std::vector<int64_t>{0, 1021, 3062, 5103}));
}

TEST(DataSplit, BadSplitsAreNamed) {
  EXPECT_THROW_WITH(data::parse_data_split("2,x,4"), core::ConfigError, "data_split '2,x,4': 'x'");
  EXPECT_THROW_WITH(data::parse_data_split("0,0"), core::ConfigError, "positive sum");
  EXPECT_THROW_WITH(data::phase_indices("10,0,0", 3, 1234, 10), core::InvalidArgument, "phase index 3");
}

TEST(DataSplit, MatchesNumpyRandomStateAndDeepSpeedChatArithmetic) {
  const std::string script = R"PY(
import json, sys
import numpy as np
cases = []
for seed, size, split in [(1234, 1000, "2,4,4"), (42, 5103, "2,4,4"), (0, 1, "10,0,0"), (7, 97, "1,1,1"),
                          (4294967295, 333, "6,2,2"), (1234, 76256, "2,4,4"), (99, 10, "3,3,4")]:
    perm = np.arange(size, dtype=np.uint32)
    np.random.RandomState(seed).shuffle(perm)
    weights = [float(s) for s in split.split(",")]
    weights = [w / sum(weights) for w in weights]
    idx = [0]
    for w in weights:
        idx.append(idx[-1] + int(round(w * float(size))))
    diff = idx[-1] - size
    idx = [idx[0]] + [i - diff for i in idx[1:]]
    cases.append({"seed": seed, "size": size, "split": split, "perm": perm.tolist(), "bounds": idx})
json.dump(cases, open(sys.argv[1], "w"))
)PY";
  nlohmann::json cases = testing::run_python_json(script);
  ASSERT_EQ(cases.size(), 7u);
  for (const auto& c : cases) {
    auto seed = c["seed"].get<uint32_t>();
    auto size = c["size"].get<int64_t>();
    std::string split = c["split"];
    EXPECT_EQ(data::numpy_legacy_permutation(seed, size), c["perm"].get<std::vector<int64_t>>()) << seed << " " << size;
    auto bounds = data::split_boundaries(data::parse_data_split(split), size);
    EXPECT_EQ(bounds, c["bounds"].get<std::vector<int64_t>>()) << split << " " << size;
    auto perm = c["perm"].get<std::vector<int64_t>>();
    for (int64_t phase = 0; phase + 1 < static_cast<int64_t>(bounds.size()); ++phase) {
      std::vector<int64_t> want(perm.begin() + bounds[phase], perm.begin() + bounds[phase + 1]);
      EXPECT_EQ(data::phase_indices(split, phase, seed, size), want);
    }
  }
}

}  // namespace
}  // namespace dschat
