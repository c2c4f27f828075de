// Exceptions, status-code checks, logging levels/callback/rank, environment parsing.
#include <gtest/gtest.h>

#include <cstdlib>

#include "core/env.h"
#include "core/log.h"
#include "core/strings.h"
#include "dschat/core/logging.h"
#include "dschat/core/status_check.h"
#include "test_util.h"

namespace dschat {
namespace {

enum FakeStatus { kFakeOk = 0, kFakeOutOfMemory = 2 };
const char* describe_fake(FakeStatus s) { return s == kFakeOutOfMemory ? "out of memory" : "ok"; }
FakeStatus fake_call(FakeStatus s) { return s; }

TEST(ErrorTest, CheckStreamsAllPartsIntoTheMessage) {
  int got = 4095;
  EXPECT_THROW_WITH(DSCHAT_CHECK(got == 4096, InvalidArgument, "rms_norm: expected weight.size(0) == 4096, got ", got),
                    core::InvalidArgument, "rms_norm: expected weight.size(0) == 4096, got 4095");
  EXPECT_NO_THROW(DSCHAT_CHECK(got == 4095, InvalidArgument, "unused"));
}

TEST(ErrorTest, StatusCheckNamesLibraryCallCodeAndLocation) {
  EXPECT_NO_THROW(DSCHAT_STATUS_CHECK("FAKE", fake_call(kFakeOk), kFakeOk, describe_fake));
  try {
    DSCHAT_STATUS_CHECK("FAKE", fake_call(kFakeOutOfMemory), kFakeOk, describe_fake);
    FAIL() << "expected DeviceError";
  } catch (const core::DeviceError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("FAKE call failed: fake_call(kFakeOutOfMemory) returned 2 (out of memory)"), std::string::npos) << what;
    EXPECT_NE(what.find("error_logging_test.cpp:"), std::string::npos) << what;
  }
}

TEST(ErrorTest, InternalAssertReportsFileAndLine) {
  EXPECT_THROW_WITH(DSCHAT_INTERNAL_ASSERT(1 + 1 == 3, "math"), core::Error, "error_logging_test.cpp:");
}

TEST(LoggingTest, CallbackReceivesMessagesAtOrAboveLevel) {
  std::vector<std::pair<core::LogLevel, std::string>> seen;
  core::LogLevel saved = core::log_level();
  core::set_log_callback([&](core::LogLevel level, const std::string& m) { seen.emplace_back(level, m); });
  core::set_log_level(core::LogLevel::Info);
  core::log_debug("hidden");
  core::log_info("loaded ", 3, " tensors");
  core::log_warn_once("only once");
  core::log_warn_once("only once");
  core::set_log_callback(nullptr);
  core::set_log_level(saved);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].second, "loaded 3 tensors");
  EXPECT_EQ(seen[1].first, core::LogLevel::Warn);
}

TEST(LoggingTest, LevelNamesAndRank) {
  EXPECT_EQ(core::parse_log_level("debug"), core::LogLevel::Debug);
  EXPECT_THROW_WITH(core::parse_log_level("loud"), core::InvalidArgument, "got 'loud'");
  int saved = core::log_rank();
  core::set_log_rank(3);
  EXPECT_EQ(core::log_rank(), 3);
  core::set_log_rank(saved);
}

TEST(EnvTest, ParsesAndRejectsWithVariableName) {
  setenv("DSCHAT_TEST_INT", "12", 1);
  EXPECT_EQ(core::read_int_from_env("DSCHAT_TEST_INT").value(), 12);
  setenv("DSCHAT_TEST_INT", "12x", 1);
  EXPECT_THROW_WITH(core::read_int_from_env("DSCHAT_TEST_INT"), core::ConfigError, "DSCHAT_TEST_INT");
  setenv("DSCHAT_TEST_BOOL", "on", 1);
  EXPECT_TRUE(core::read_bool_from_env("DSCHAT_TEST_BOOL", false));
  unsetenv("DSCHAT_TEST_BOOL");
  EXPECT_FALSE(core::read_bool_from_env("DSCHAT_TEST_BOOL", false));
}

TEST(StringsTest, NearestNameNeedsAPlausibleTypo) {
  EXPECT_EQ(core::nearest_name("zero_optimisation", {"zero_optimization", "fp16"}), "zero_optimization");
  EXPECT_EQ(core::nearest_name("completely_else", {"fp16", "bf16"}), "");
  EXPECT_EQ(core::edit_distance("kitten", "sitting"), 3u);
}

}  // namespace
}  // namespace dschat
