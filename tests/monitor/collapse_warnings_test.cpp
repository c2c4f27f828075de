// The step-3 collapse warnings: each fires when its condition first holds, once until it clears;
// the short-answer one only where the step's minimum answer length makes length meaningful.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dschat/monitor/collapse_warnings.h"

namespace dschat {
namespace {

const std::vector<std::string> kVaried = {"a", "b", "c", "d"};

TEST(CollapseWatch, ShortAnswersWarnOnceAboveAOneTokenMinimumOnly) {
  monitor::CollapseWatch ds_chat(8);  // DS-Chat's minimum: 2 tokens
  ds_chat.observe_step(6.0, 0.1, kVaried);
  EXPECT_EQ(ds_chat.warnings(), 0);
  ds_chat.observe_step(2.4, 0.1, kVaried);
  ds_chat.observe_step(2.2, 0.1, kVaried);  // still short: no repeat
  EXPECT_EQ(ds_chat.warnings(), 1);
  ds_chat.observe_step(4.0, 0.1, kVaried);  // cleared
  ds_chat.observe_step(2.0, 0.1, kVaried);  // and again
  EXPECT_EQ(ds_chat.warnings(), 2);

  monitor::CollapseWatch one_token_answers(4, 1);  // the demo: the right answer is one token
  one_token_answers.observe_step(1.0, 0.1, kVaried);
  one_token_answers.observe_step(1.6, 0.1, kVaried);
  EXPECT_EQ(one_token_answers.warnings(), 0);
  one_token_answers.observe_generation(3, 16);  // most rows dropped as too short: that still warns
  EXPECT_EQ(one_token_answers.warnings(), 1);
}

TEST(CollapseWatch, RamblingRunawayKlAndOneReplyForEveryPromptWarn) {
  monitor::CollapseWatch watch(16, 2, 5.0);
  watch.observe_step(15.6, 0.1, kVaried);  // answers run to the maximum
  EXPECT_EQ(watch.warnings(), 1);
  watch.observe_step(8.0, 6.0, kVaried);  // KL above the limit
  EXPECT_EQ(watch.warnings(), 2);
  watch.observe_step(8.0, 0.1, {"same", "same", "same", "same"});
  EXPECT_EQ(watch.warnings(), 3);
  watch.observe_step(8.0, 0.1, {"same", "same", "same", "other"});  // not all one reply
  EXPECT_EQ(watch.warnings(), 3);
}

}  // namespace
}  // namespace dschat
