// rlhf::RewardProgram against small Python programs: answers in order over several calls (the
// program stays up, meta passes through), a batch far larger than the socket buffers (queries
// are written while answers are read), and every bad answer the issue names: not JSON, no
// "reward", NaN, a crash, a hang past the timeout, a program that does not exist. Each error
// names the program and the query; after one, the program is not used again.
#include <gtest/gtest.h>

#include <fstream>

#include "dschat/core/error.h"
#include "dschat/rlhf/rewards/reward_program.h"
#include "test_util.h"

namespace dschat {
namespace {

namespace fs = std::filesystem;

// A program reading JSON Lines on stdin and printing `answer(query)` per line (Python source).
rlhf::RewardProgramOptions python_program(const fs::path& dir, const std::string& name, const std::string& answer,
                                          std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  const fs::path file = dir / (name + ".py");
  std::ofstream(file) << "import json, sys, time\n"
                         "for i, line in enumerate(sys.stdin):\n"
                         "    q = json.loads(line)\n"
                         "    out = " << answer << "\n"
                         "    if out is not None:\n"
                         "        sys.stdout.write(out + '\\n')\n"
                         "        sys.stdout.flush()\n";
  return {{DSCHAT_PYTHON, file.string()}, timeout};
}

std::vector<rlhf::RewardQuery> queries(int n, size_t response_bytes = 3) {
  std::vector<rlhf::RewardQuery> out;
  for (int i = 0; i < n; ++i) out.push_back({"prompt " + std::to_string(i), std::string(response_bytes, 'x'), {{"i", i}}});
  return out;
}

TEST(RewardProgram, AnswersInOrderAcrossCallsAndLargeBatches) {
  testing::TempDir tmp;
  rlhf::RewardProgram program(
      python_program(tmp.path(), "score", "json.dumps({'reward': q['meta']['i'] + len(q['response']) / 1000})"));
  EXPECT_EQ(program.score(queries(3)), (std::vector<double>{0.003, 1.003, 2.003}));
  EXPECT_EQ(program.score({}), std::vector<double>{});
  // 3000 queries of 2 KB each: 6 MB of input, far beyond what the socket buffers hold.
  const std::vector<double> many = program.score(queries(3000, 2000));
  ASSERT_EQ(many.size(), 3000u);
  for (size_t i = 0; i < many.size(); ++i) ASSERT_DOUBLE_EQ(many[i], static_cast<double>(i) + 2.0) << i;
}

TEST(RewardProgram, BadAnswersStopWithAnErrorNamingTheProgramAndTheLine) {
  testing::TempDir tmp;
  struct Case {
    std::string name, answer, error;
  };
  const std::vector<Case> cases = {
      {"not_json", "'ok' if i < 1 else 'the answer is 42'", "its answer to query 0 is not a JSON object: 'ok'"},
      {"no_key", "json.dumps({'score': 1.0})", "its answer to query 0 has no \"reward\": '{\"score\": 1.0}'"},
      {"text", "json.dumps({'reward': 'high'})", "has a \"reward\" that is not a number"},
      {"nan", "json.dumps({'reward': float('nan')})", "is not a JSON object: '{\"reward\": NaN}'"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    rlhf::RewardProgram program(python_program(tmp.path(), c.name, c.answer));
    EXPECT_THROW_WITH(program.score(queries(2)), core::FormatError, "reward program '");
    EXPECT_THROW_WITH(program.score(queries(2)), core::IoError, "failed earlier in this run");
    rlhf::RewardProgram again(python_program(tmp.path(), c.name, c.answer));
    EXPECT_THROW_WITH(again.score(queries(2)), core::FormatError, c.error);
  }
}

TEST(RewardProgram, ACrashAHangAndAMissingProgramAreIoErrors) {
  testing::TempDir tmp;
  rlhf::RewardProgram crash(
      python_program(tmp.path(), "crash", "json.dumps({'reward': 1}) if i < 1 else sys.exit(3)"));
  EXPECT_THROW_WITH(crash.score(queries(3)), core::IoError,
                    "its output ended before the answer to query 1 (it exited with status 3)");
  rlhf::RewardProgram hang(python_program(tmp.path(), "hang", "time.sleep(60)", std::chrono::milliseconds(500)));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW_WITH(hang.score(queries(1)), core::IoError, "no answer to query 0 within 500 ms (killed)");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
  EXPECT_THROW_WITH(rlhf::RewardProgram({{"dschat-no-such-reward-program"}, std::chrono::seconds(1)}), core::IoError,
                    "cannot start dschat-no-such-reward-program");
  EXPECT_THROW_WITH(rlhf::RewardProgram({{}, std::chrono::seconds(1)}), core::InvalidArgument, "\"argv\" is empty");
}

}  // namespace
}  // namespace dschat
