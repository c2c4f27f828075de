// Asynchronous checkpointing: engine::AsyncCheckpointWriter's ordering and failure rules, and
// TrainingEngine::save_checkpoint with a background writer on each device (cpu in CI, cuda where
// a GPU exists): the files hold the state at the call, not what training moved on to, byte for
// byte what a synchronous save writes; a failed background write leaves the previous tag latest.
#include <gtest/gtest.h>

#include <fstream>
#include <future>
#include <vector>

#include "dschat/core/error.h"
#include "dschat/engine/async_checkpoint_writer.h"
#include "dschat/engine/checkpoint_shards.h"
#include "dschat/engine/training_engine.h"
#include "engine/checkpoint_testing.h"
#include "test_util.h"

namespace dschat {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

TEST(AsyncCheckpointWriter, RunsJobsInOrderAndSkipsTheOnesQueuedBehindAFailure) {
  engine::AsyncCheckpointWriter writer;
  std::vector<int> ran;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  writer.submit([&, released](const std::atomic<bool>&) {
    released.wait();
    ran.push_back(1);
  });
  writer.submit([&](const std::atomic<bool>&) { ran.push_back(2); });
  EXPECT_TRUE(writer.busy());
  EXPECT_FALSE(writer.wait_for(std::chrono::milliseconds(20)));
  release.set_value();
  writer.wait();
  EXPECT_EQ(ran, (std::vector<int>{1, 2}));

  writer.submit([&](const std::atomic<bool>&) { throw core::IoError("disk gone"); });
  writer.submit([&](const std::atomic<bool>&) { ran.push_back(3); });  // a later part: skipped
  EXPECT_THROW_WITH(writer.wait(), core::IoError, "disk gone");
  writer.wait();  // reported once
  writer.submit([&](const std::atomic<bool>&) { ran.push_back(4); });
  writer.wait();
  EXPECT_EQ(ran, (std::vector<int>{1, 2, 4}));
  EXPECT_FALSE(writer.busy());
}

struct Batch {
  torch::Tensor x;  // [4, 8]
  torch::Tensor y;  // [4, 4]
};

class AsyncCheckpointOn : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "cuda" && !torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  }
  torch::Device device() const { return torch::Device(GetParam()); }

  // A two-layer MLP under AdamW with a cosine schedule, on the test's device.
  std::unique_ptr<engine::TrainingEngine> make_engine() {
    torch::manual_seed(3);
    model_ = std::make_shared<torch::nn::SequentialImpl>(torch::nn::Linear(8, 16), torch::nn::Tanh(),
                                                         torch::nn::Linear(16, 4));
    model_->to(device());
    engine::TrainingEngineOptions options;
    options.config = engine::DeepSpeedConfig::parse({{"train_batch_size", 4}, {"train_micro_batch_size_per_gpu", 4}},
                                                    1, "test");
    options.optimizer.lr = 1e-2;
    engine::LrScheduleOptions schedule;
    schedule.type = "cosine";
    schedule.num_training_steps = 20;
    options.lr_schedule = schedule;
    return std::make_unique<engine::TrainingEngine>(model_, options);
  }

  void train(engine::TrainingEngine& engine, int steps) {
    for (int i = 0; i < steps; ++i) {
      torch::manual_seed(100 + engine.global_steps());
      const Batch b{torch::randn({4, 8}).to(device()), torch::randn({4, 4}).to(device())};
      engine.backward((model_->forward(b.x) - b.y).pow(2).mean());
      engine.step();
    }
  }

  std::shared_ptr<torch::nn::SequentialImpl> model_;
  testing::TempDir tmp_;
};

std::string file_bytes(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The background write is held back until training has taken three more steps: what it writes
// must still be the state of the call, identical to a synchronous save made at the same point.
TEST_P(AsyncCheckpointOn, ABackgroundSaveWritesTheSnapshotNotTheStateTrainingMovedOnTo) {
  auto engine = make_engine();
  train(*engine, 3);
  engine->save_checkpoint(tmp_ / "sync", "tag", {{"note", "x"}});

  engine::AsyncCheckpointWriter writer;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  writer.submit([released](const std::atomic<bool>&) { released.wait(); });  // holds the queue
  engine->save_checkpoint(tmp_ / "async", "tag", {{"note", "x"}}, &writer);
  train(*engine, 3);
  EXPECT_FALSE(fs::exists(tmp_ / "async/latest"));
  release.set_value();
  engine::wait_for_checkpoint_writes(writer, nullptr);

  EXPECT_EQ(engine::latest_checkpoint_tag(tmp_ / "async"), "tag");
  for (const char* file : {"rank0.safetensors", "rank0.json", "engine.json", "manifest.json"}) {
    const std::string expected = file_bytes(tmp_ / "sync/tag" / file);
    EXPECT_FALSE(expected.empty()) << file;
    EXPECT_TRUE(file_bytes(tmp_ / "async/tag" / file) == expected) << file << " differs from the synchronous save";
  }
  // And it resumes: a fresh engine loading it continues exactly as the first one did.
  auto resumed = make_engine();
  resumed->load_checkpoint(tmp_ / "async");
  train(*resumed, 3);
  const auto expected = engine->module().parameters(), got = resumed->module().parameters();
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(torch::equal(got[i], expected[i])) << i;
}

// A background write that fails (here inside the write, after this rank's files) is reported by
// the wait; the staging directory is gone and `latest` still names the previous tag.
TEST_P(AsyncCheckpointOn, AFailedBackgroundWriteLeavesThePreviousTagLatest) {
  auto engine = make_engine();
  engine::AsyncCheckpointWriter writer;
  train(*engine, 1);
  engine->save_checkpoint(tmp_.path(), "", json::object(), &writer);
  engine::wait_for_checkpoint_writes(writer, nullptr);
  train(*engine, 1);
  struct FailingWrite {
    FailingWrite() {
      engine::testing::set_checkpoint_write_hook([](const fs::path&) { throw core::IoError("injected write failure"); });
    }
    ~FailingWrite() { engine::testing::set_checkpoint_write_hook(nullptr); }
  } failing;
  engine->save_checkpoint(tmp_.path(), "", json::object(), &writer);
  EXPECT_THROW_WITH(engine::wait_for_checkpoint_writes(writer, nullptr), core::IoError, "injected write failure");
  EXPECT_EQ(engine::latest_checkpoint_tag(tmp_.path()), "global_step1");
  EXPECT_FALSE(fs::exists(tmp_ / "global_step2"));
  EXPECT_FALSE(fs::exists(tmp_ / ".tmp-global_step2"));
  EXPECT_NO_THROW(engine::CheckpointShards::open(tmp_ / "global_step1"));
}

INSTANTIATE_TEST_SUITE_P(Devices, AsyncCheckpointOn, ::testing::Values("cpu", "cuda"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace dschat
