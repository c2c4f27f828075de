// Prefetcher: order, end of data, error propagation, the depth bound and prompt shutdown.
// Shutdown tests run the destructor on a helper thread with a deadline, so a hang fails the test
// instead of hanging the suite.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "dschat/data/prefetch.h"
#include "test_util.h"

namespace dschat {
namespace {

using data::Prefetcher;
using namespace std::chrono_literals;

// Runs `work` on a detached thread; true when it finished within `limit`. On a timeout the thread
// is left running (the test has failed anyway) and only touches the shared state it owns.
bool finishes_within(std::chrono::milliseconds limit, std::function<void()> work) {
  auto finished = std::make_shared<std::promise<void>>();
  std::future<void> done = finished->get_future();
  std::thread([finished, work = std::move(work)] {
    work();
    finished->set_value();
  }).detach();
  return done.wait_for(limit) == std::future_status::ready;
}

// Polls `condition` until it holds or `limit` passes.
template <class Condition>
bool eventually(Condition condition, std::chrono::milliseconds limit = 5000ms) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// Produces 0, 1, ..., count - 1 then the end, optionally sleeping before each batch.
std::function<std::optional<int>()> counting_producer(int count, std::chrono::microseconds delay = 0us) {
  auto next = std::make_shared<int>(0);
  return [next, count, delay]() -> std::optional<int> {
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    if (*next >= count) return std::nullopt;
    return (*next)++;
  };
}

TEST(Prefetch, PreservesOrderAndEndsWithNullopt) {
  for (int64_t depth : {1, 2, 8}) {
    Prefetcher<int> batches(counting_producer(100), depth);
    for (int expected = 0; expected < 100; ++expected) {
      std::optional<int> batch = batches.next();
      ASSERT_TRUE(batch.has_value()) << "depth " << depth << " ended early at " << expected;
      ASSERT_EQ(*batch, expected) << "depth " << depth;
    }
    EXPECT_FALSE(batches.next().has_value());
    EXPECT_FALSE(batches.next().has_value());  // stays at the end
  }
}

TEST(Prefetch, ProducerIsNotCalledAgainAfterTheEnd) {
  auto calls = std::make_shared<std::atomic<int>>(0);
  auto inner = counting_producer(3);
  Prefetcher<int> batches([calls, inner] { ++*calls; return inner(); }, 4);
  int received = 0;
  while (batches.next()) ++received;
  EXPECT_EQ(received, 3);
  EXPECT_FALSE(batches.next().has_value());
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(calls->load(), 4);  // three batches and the one end marker
}

TEST(Prefetch, EmptyProductionEndsImmediately) {
  Prefetcher<std::string> batches([]() -> std::optional<std::string> { return std::nullopt; }, 2);
  EXPECT_FALSE(batches.next().has_value());
}

TEST(Prefetch, ProducerErrorComesAfterTheEarlierBatches) {
  auto next = std::make_shared<int>(0);
  Prefetcher<int> batches(
      [next]() -> std::optional<int> {
        if (*next == 3) DSCHAT_THROW(IoError, "shard 7 is truncated");
        return (*next)++;
      },
      8);
  // Let the thread run into the error before consuming, so the queue holds batches and the error.
  std::this_thread::sleep_for(50ms);
  for (int expected = 0; expected < 3; ++expected) {
    std::optional<int> batch = batches.next();
    ASSERT_TRUE(batch.has_value());
    EXPECT_EQ(*batch, expected);
  }
  EXPECT_THROW_WITH(batches.next(), core::IoError, "shard 7 is truncated");
  EXPECT_THROW_WITH(batches.next(), core::IoError, "shard 7 is truncated");  // sticky, not a silent end
}

TEST(Prefetch, NonDschatExceptionsPropagateToo) {
  Prefetcher<int> batches([]() -> std::optional<int> { throw std::out_of_range("row 12"); }, 1);
  EXPECT_THROW_WITH(batches.next(), std::out_of_range, "row 12");
}

TEST(Prefetch, DepthBoundIsRespected) {
  for (int64_t depth : {1, 3}) {
    auto produced = std::make_shared<std::atomic<int64_t>>(0);
    Prefetcher<int64_t> batches([produced]() -> std::optional<int64_t> { return (*produced)++; }, depth);
    // Nothing consumed yet: the thread fills the queue to `depth` and then stops calling the producer.
    ASSERT_TRUE(eventually([&] { return produced->load() >= depth; })) << "depth " << depth;
    std::this_thread::sleep_for(50ms);
    EXPECT_EQ(produced->load(), depth) << "depth " << depth;
    // While consuming slowly, the producer never gets more than `depth` calls ahead, and it does
    // refill: after each next() it gets back to exactly `depth` ahead and stays there.
    for (int64_t consumed = 0; consumed < 20; ++consumed) {
      std::optional<int64_t> batch = batches.next();
      ASSERT_TRUE(batch.has_value());
      EXPECT_EQ(*batch, consumed);
      EXPECT_LE(produced->load() - (consumed + 1), depth) << "depth " << depth << " after " << consumed;
      EXPECT_TRUE(eventually([&] { return produced->load() - (consumed + 1) >= depth; })) << "no refill";
      std::this_thread::sleep_for(2ms);  // a free-running producer would overrun within this pause
      EXPECT_EQ(produced->load() - (consumed + 1), depth) << "depth " << depth << " after " << consumed;
    }
  }
}

TEST(Prefetch, DestructionWhileTheQueueIsFullIsPrompt) {
  auto produced = std::make_shared<std::atomic<int64_t>>(0);
  auto batches = std::make_shared<Prefetcher<int64_t>>(
      [produced]() -> std::optional<int64_t> { return (*produced)++; }, 2);  // never ends
  ASSERT_EQ(batches->next(), std::optional<int64_t>(0));
  ASSERT_TRUE(eventually([&] { return produced->load() >= 3; }));  // full again: the thread waits for space
  // The helper thread must hold the only reference, so that its reset() runs the destructor.
  EXPECT_TRUE(finishes_within(2000ms, [last = std::move(batches)]() mutable { last.reset(); }))
      << "the destructor hung on a producer blocked by a full queue";
  int64_t after = produced->load();
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(produced->load(), after);  // the thread is really gone
}

TEST(Prefetch, DestructionWaitsForTheProducerCallInFlight) {
  auto release = std::make_shared<std::promise<void>>();
  auto released = std::make_shared<std::shared_future<void>>(release->get_future().share());
  auto entered = std::make_shared<std::atomic<bool>>(false);
  bool release_sent = false;
  auto batches = std::make_shared<Prefetcher<int>>(
      [released, entered]() -> std::optional<int> {
        *entered = true;
        released->wait();
        return 1;
      },
      1);
  // Declared after `batches`, so it runs first if an ASSERT returns early: never leave the
  // producer blocked, or the Prefetcher's destructor would wait for it forever.
  struct ReleaseOnExit {
    std::function<void()> send;
    ~ReleaseOnExit() { send(); }
  } guard{[&] {
    if (!release_sent) release->set_value();
    release_sent = true;
  }};
  ASSERT_TRUE(eventually([&] { return entered->load(); }));
  auto destroyed = std::make_shared<std::atomic<bool>>(false);
  std::thread destroyer([batches = std::move(batches), destroyed]() mutable {
    batches.reset();
    *destroyed = true;
  });
  std::this_thread::sleep_for(30ms);
  EXPECT_FALSE(destroyed->load());  // still inside the producer call, as documented
  guard.send();
  EXPECT_TRUE(eventually([&] { return destroyed->load(); }, 2000ms));
  destroyer.join();
}

TEST(Prefetch, SlowConsumerFastProducer) {
  Prefetcher<int> batches(counting_producer(40), 3);
  for (int expected = 0; expected < 40; ++expected) {
    std::this_thread::sleep_for(1ms);
    EXPECT_EQ(batches.next(), std::optional<int>(expected));
  }
  EXPECT_FALSE(batches.next().has_value());
}

TEST(Prefetch, FastConsumerSlowProducer) {
  Prefetcher<int> batches(counting_producer(40, 1000us), 3);
  for (int expected = 0; expected < 40; ++expected) EXPECT_EQ(batches.next(), std::optional<int>(expected));
  EXPECT_FALSE(batches.next().has_value());
}

TEST(Prefetch, MoveOnlyBatches) {
  auto next = std::make_shared<int>(0);
  Prefetcher<std::unique_ptr<int>> batches(
      [next]() -> std::optional<std::unique_ptr<int>> {
        if (*next == 5) return std::nullopt;
        return std::make_unique<int>((*next)++);
      },
      2);
  for (int expected = 0; expected < 5; ++expected) {
    auto batch = batches.next();
    ASSERT_TRUE(batch.has_value());
    EXPECT_EQ(**batch, expected);
  }
  EXPECT_FALSE(batches.next().has_value());
}

TEST(Prefetch, BadArgumentsAreNamed) {
  EXPECT_THROW_WITH(Prefetcher<int>(counting_producer(1), 0), core::InvalidArgument, "depth must be >= 1, got 0");
  EXPECT_THROW_WITH(Prefetcher<int>(nullptr, 2), core::InvalidArgument, "producer is empty");
}

}  // namespace
}  // namespace dschat
