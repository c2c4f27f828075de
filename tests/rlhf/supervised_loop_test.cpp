// rlhf::SupervisedLoop driven directly, without the SFT/RM trainers: the tiny OPT fixture (dropout
// 0.1, so a resume must also restore the random state) learns the next tokens of a toy dataset of
// 10 rows, 2 rows a micro-batch, 2 micro-batches an optimizer step, 2 epochs. An epoch has 5
// micro-batches, so the third optimizer step's window spans the epoch boundary.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "dschat/data/sampler.h"
#include "dschat/engine/checkpoint_shards.h"
#include "dschat/engine/training_engine.h"
#include "dschat/io/state_dict.h"
#include "dschat/models/load_save.h"
#include "dschat/rlhf/math/sft_loss.h"
#include "dschat/rlhf/loop/supervised_loop.h"
#include "engine/checkpoint_testing.h"
#include "rlhf/setup/step_runner_testing.h"
#include "test_util.h"

namespace dschat {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using rlhf::EvaluationPoint;

constexpr int64_t kRows = 10, kMicro = 2, kGas = 2, kEpochs = 2;

struct ToyBatch {
  torch::Tensor input_ids;  // [B, T] int64
};

// Resets the crash seam however the test leaves, so no other test inherits it.
struct CrashAfter {
  explicit CrashAfter(int64_t steps) { rlhf::testing::set_crash_after_optimizer_steps(steps); }
  ~CrashAfter() { rlhf::testing::set_crash_after_optimizer_steps(0); }
};

// What one run's hooks saw, in order.
struct Record {
  std::vector<std::string> events;
  std::vector<rlhf::OptimizerStepDone> steps;
  std::vector<rlhf::EpochDone> epochs;
  std::vector<rlhf::MicroBatchDone> micro_batches;
  std::vector<double> losses;  // what train_micro_batch returned, in order
  std::optional<rlhf::ResumePoint> resumed;
  int64_t evaluations = 0;
  bool checkpoint_at_save = false;  // a checkpoint existed when save_model ran
  std::map<std::string, torch::Tensor> parameters;  // at the end of the run
  int64_t micro_steps = 0, global_steps = 0;
};

const char* point_name(EvaluationPoint point) {
  switch (point) {
    case EvaluationPoint::kBeforeTraining: return "before";
    case EvaluationPoint::kInterval: return "interval";
    case EvaluationPoint::kEpochEnd: return "epoch_end";
    case EvaluationPoint::kResumedAtEnd: return "resumed_at_end";
  }
  return "?";
}

struct RunOptions {
  int64_t checkpoint_interval = 0;
  int64_t keep_checkpoints = 2;
  int64_t eval_interval = 0;
  int64_t progress_interval = 1;  // also how often the loop reads the losses from the device
  bool perturb = false;          // shift every parameter first: only a checkpoint can undo it
  bool fail_save = false;        // save_model throws (the checkpoints stay)
  bool async_checkpoint = true;  // saves on the runner's background writer
  std::string resume_from;       // --resume-from
  json extra_client_state = json::object();  // merged into the hook's client state
};

class SupervisedLoopTest : public ::testing::Test {
 protected:
  SupervisedLoopTest() {
    torch::manual_seed(21);
    rows_ = torch::randint(3, 512, {kRows, 8}, torch::kInt64);  // [10, 8] int64
  }

  // One run of the loop with output directory <tmp>/<name> over a freshly loaded model and engine.
  Record run(const std::string& name, const RunOptions& options) {
    Record r;
    torch::manual_seed(options.perturb ? 999 : 1234);
    models::CausalLM model = models::load_causal_lm(testing::fixture("opt-preln").string());
    if (options.perturb) {
      torch::NoGradGuard no_grad;
      for (auto& p : model->parameters()) p.add_(0.5);
    }
    model->train();
    engine::TrainingEngineOptions engine_options;
    engine_options.config = engine::DeepSpeedConfig::parse(
        {{"train_batch_size", kMicro * kGas}, {"train_micro_batch_size_per_gpu", kMicro}}, 1, "test");
    engine_options.optimizer.lr = 1e-2;
    engine::TrainingEngine engine(model.ptr(), engine_options);

    rlhf::CommonStepConfig common;
    common.checkpoint_interval = options.checkpoint_interval;
    common.keep_checkpoints = options.keep_checkpoints;
    common.async_checkpoint = options.async_checkpoint;
    rlhf::StepContext context;
    context.progress = false;
    context.resume_from = options.resume_from;
    rlhf::StepRunner runner("toy step", tmp_ / name, common, context);
    data::DistributedSampler sampler(kRows, 1, 0, /*shuffle=*/true, /*seed=*/7);

    rlhf::SupervisedLoop<ToyBatch> loop;
    loop.epochs = kEpochs;
    loop.eval_interval = options.eval_interval;
    loop.progress_label = "toy";
    loop.progress_total = 5;
    loop.plain_progress = true;
    loop.progress_interval = options.progress_interval;
    loop.epoch_batches = [&](int64_t epoch) {
      return data::EpochBatches<ToyBatch>(sampler, epoch, kMicro, false, [this](const std::vector<int64_t>& items) {
        return ToyBatch{rows_.index_select(0, torch::tensor(items, torch::kInt64))};
      });
    };
    torch::Tensor last_ids;  // [B, T] int64: the micro-batch trained last
    std::vector<torch::Tensor> trained_ids;  // each [B, T] int64: the micro-batches in training order
    loop.train_micro_batch = [&](const ToyBatch& batch) {
      last_ids = batch.input_ids;
      trained_ids.push_back(batch.input_ids);
      torch::Tensor loss = rlhf::causal_lm_loss(model->forward(batch.input_ids), batch.input_ids);  // []
      r.losses.push_back(loss.item<double>());
      return loss;
    };
    loop.after_backward = [&](const rlhf::MicroBatchDone& done) { r.micro_batches.push_back(done); };
    loop.on_optimizer_step = [&](const rlhf::OptimizerStepDone& done, const ToyBatch& batch) {
      if (options.progress_interval == 1) {  // reported right after the step
        EXPECT_TRUE(torch::equal(batch.input_ids, last_ids)) << "step " << done.step << " got another batch";
        EXPECT_EQ(done.step, engine.global_steps());
      } else if (!r.resumed) {  // reported later, with the batch that ended the window
        const size_t last = static_cast<size_t>(done.step * kGas - 1);
        EXPECT_TRUE(last < trained_ids.size() && torch::equal(batch.input_ids, trained_ids[last]))
            << "step " << done.step << " got another batch";
        EXPECT_LE(done.step, engine.global_steps());
      }
      r.steps.push_back(done);
      r.events.push_back("step " + std::to_string(done.step));
      return "loss " + std::to_string(done.window_loss);
    };
    loop.on_epoch_end = [&](const rlhf::EpochDone& done) {
      r.epochs.push_back(done);
      r.events.push_back("epoch_end " + std::to_string(done.epoch));
    };
    loop.evaluate = [&](const rlhf::EvaluationRequest& at) {
      ++r.evaluations;
      r.events.push_back(std::string("eval ") + point_name(at.point) + " e" + std::to_string(at.epoch) + " s" +
                         std::to_string(at.step));
    };
    loop.client_state = [&] {
      json state = {{"evaluations", r.evaluations}, {"marker", "toy"}};
      state.update(options.extra_client_state);
      return state;
    };
    loop.on_resume = [&](const rlhf::ResumePoint& at) {
      r.resumed = at;
      r.events.push_back("resume e" + std::to_string(at.epoch) + " b" + std::to_string(at.micro_batch));
    };
    loop.save_model = [&] {
      r.events.push_back("save_model");
      r.checkpoint_at_save = runner.can_resume();
      if (options.fail_save) throw std::runtime_error("disk full");
    };
    loop.run(runner, engine);
    for (const auto& item : model->named_parameters()) r.parameters[item.key()] = item.value().detach().clone();
    r.micro_steps = engine.micro_steps();
    r.global_steps = engine.global_steps();
    return r;
  }

  fs::path checkpoints(const std::string& name) const { return tmp_ / (name + "_checkpoints"); }

  testing::TempDir tmp_;
  torch::Tensor rows_;  // [10, 8] int64
};

TEST_F(SupervisedLoopTest, AccumulatesStepsAndCallsTheHooksInOrder) {
  RunOptions options;
  options.eval_interval = 2;
  const Record r = run("plain", options);
  EXPECT_EQ(r.micro_steps, 10);
  EXPECT_EQ(r.global_steps, 5);
  ASSERT_EQ(r.losses.size(), 10u);
  const std::vector<std::string> expected = {
      "eval before e0 s0", "step 1", "step 2", "eval interval e0 s2", "epoch_end 0", "eval epoch_end e0 s2",
      "step 3", "step 4", "eval interval e1 s4", "step 5", "epoch_end 1", "eval epoch_end e1 s5", "save_model"};
  EXPECT_EQ(r.events, expected);

  // (epoch, micro-batches of the epoch consumed) at each step: the resume positions.
  const std::vector<std::pair<int64_t, int64_t>> positions = {{0, 2}, {0, 4}, {1, 1}, {1, 3}, {1, 5}};
  ASSERT_EQ(r.steps.size(), positions.size());
  for (size_t i = 0; i < positions.size(); ++i) {
    EXPECT_EQ(r.steps[i].epoch, positions[i].first) << "step " << i + 1;
    EXPECT_EQ(r.steps[i].micro_batch, positions[i].second) << "step " << i + 1;
    EXPECT_GE(r.steps[i].seconds, 0.0);
  }
  // Windows inside one epoch report Σ loss / GAS over their two micro-batches (micro-steps 1-2, 3-4, 7-8, 9-10).
  for (auto [step, first] : std::vector<std::pair<size_t, size_t>>{{1, 0}, {2, 2}, {4, 6}, {5, 8}}) {
    EXPECT_DOUBLE_EQ(r.steps[step - 1].window_loss, r.losses[first] / 2.0 + r.losses[first + 1] / 2.0) << step;
  }

  ASSERT_EQ(r.micro_batches.size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(r.micro_batches[i].epoch, static_cast<int64_t>(i / 5));
    EXPECT_EQ(r.micro_batches[i].index, static_cast<int64_t>(i % 5));
    EXPECT_EQ(r.micro_batches[i].loss, r.losses[i]);
  }
  ASSERT_EQ(r.epochs.size(), 2u);
  for (size_t e = 0; e < 2; ++e) {
    double sum = 0.0;
    for (size_t i = 5 * e; i < 5 * e + 5; ++i) sum += r.losses[i];
    EXPECT_EQ(r.epochs[e].epoch, static_cast<int64_t>(e));
    EXPECT_EQ(r.epochs[e].micro_batches, 5);
    EXPECT_DOUBLE_EQ(r.epochs[e].mean_loss, sum / 5.0);
  }
  // The last epoch ends on a window boundary, so its checkpoint exists when the model is saved
  // (the first epoch's end is inside a window: saving there would throw); then the older ones are
  // removed and the last stays (keep_last_checkpoint, the default).
  EXPECT_TRUE(r.checkpoint_at_save);
  ASSERT_TRUE(fs::exists(checkpoints("plain") / "latest"));
  EXPECT_EQ(engine::list_checkpoint_tags(checkpoints("plain")).size(), 1u);
  EXPECT_TRUE(fs::is_directory(checkpoints("plain") / engine::latest_checkpoint_tag(checkpoints("plain"))));
  // Training did something: the loss of the last epoch is below the first's.
  EXPECT_LT(r.epochs[1].mean_loss, r.epochs[0].mean_loss);
}

// The losses stay on the device and are read every progress_interval steps (and before each
// evaluation, checkpoint and epoch end): reading every third step must report, bit for bit,
// what reading every step does, in the same order around the evaluations.
TEST_F(SupervisedLoopTest, ReadingTheLossesEveryThirdStepReportsWhatReadingEveryStepDoes) {
  RunOptions every_step;
  every_step.eval_interval = 2;
  RunOptions every_third = every_step;
  every_third.progress_interval = 3;
  const Record a = run("every_step", every_step);
  const Record b = run("every_third", every_third);
  EXPECT_EQ(b.events, a.events);
  ASSERT_EQ(b.steps.size(), a.steps.size());
  for (size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_EQ(b.steps[i].step, a.steps[i].step);
    EXPECT_EQ(b.steps[i].epoch, a.steps[i].epoch);
    EXPECT_EQ(b.steps[i].micro_batch, a.steps[i].micro_batch);
    EXPECT_EQ(b.steps[i].window_loss, a.steps[i].window_loss) << "step " << i + 1;  // bitwise
    EXPECT_EQ(b.steps[i].learning_rates, a.steps[i].learning_rates) << "step " << i + 1;
  }
  ASSERT_EQ(b.epochs.size(), a.epochs.size());
  for (size_t e = 0; e < a.epochs.size(); ++e) EXPECT_EQ(b.epochs[e].mean_loss, a.epochs[e].mean_loss) << e;
  EXPECT_EQ(b.losses, a.losses);
  for (const auto& [name, value] : a.parameters) EXPECT_TRUE(torch::equal(b.parameters.at(name), value)) << name;
}

// Retention: checkpoints after every step, the run killed after step 4. keep_checkpoints 2 leaves
// exactly the two newest tags (the one `latest` names among them), 0 leaves all four, 1 the newest.
TEST_F(SupervisedLoopTest, RetentionKeepsExactlyTheNewestTags) {
  auto tags_of = [](const fs::path& dir) {
    std::vector<std::string> names;
    for (const engine::CheckpointTag& tag : engine::list_checkpoint_tags(dir)) names.push_back(tag.tag);
    return names;
  };
  const std::vector<std::pair<int64_t, std::vector<std::string>>> cases = {
      {2, {"global_step3", "global_step4"}},
      {0, {"global_step1", "global_step2", "global_step3", "global_step4"}},
      {1, {"global_step4"}}};
  for (const bool async : {true, false}) {
    for (const auto& [keep, expected] : cases) {
      RunOptions options;
      options.checkpoint_interval = 1;
      options.keep_checkpoints = keep;
      options.async_checkpoint = async;
      const std::string name = "keep" + std::to_string(keep) + (async ? "async" : "sync");
      {
        CrashAfter crash(4);
        EXPECT_THROW(run(name, options), rlhf::Interrupted);
      }
      EXPECT_EQ(tags_of(checkpoints(name)), expected) << "keep_checkpoints " << keep << (async ? " async" : " sync");
      EXPECT_EQ(engine::latest_checkpoint_tag(checkpoints(name)), "global_step4");
    }
  }
  // What is kept resumes: the run finishes as an uninterrupted one does.
  RunOptions options;
  options.checkpoint_interval = 1;
  const Record resumed = run("keep2async", options);
  ASSERT_TRUE(resumed.resumed.has_value());
  EXPECT_EQ(resumed.global_steps, 5);
}

// A save that does not fit the free space fails before writing anything, naming the bytes; the
// previous tags and `latest` are untouched, and no staging directory is left.
TEST_F(SupervisedLoopTest, ASaveThatDoesNotFitFailsBeforeWritingAnything) {
  RunOptions options;
  options.checkpoint_interval = 1;
  {
    CrashAfter crash(2);
    EXPECT_THROW(run("full", options), rlhf::Interrupted);
  }
  struct FreeBytes {
    explicit FreeBytes(int64_t bytes) { engine::testing::set_checkpoint_free_bytes(bytes); }
    ~FreeBytes() { engine::testing::set_checkpoint_free_bytes(-1); }
  } disk_full(1000);
  EXPECT_THROW_WITH(run("full", options), core::IoError,
                    "not enough free space for checkpoint global_step3: it needs ");
  std::vector<std::string> names;
  for (const engine::CheckpointTag& tag : engine::list_checkpoint_tags(checkpoints("full"))) names.push_back(tag.tag);
  EXPECT_EQ(names, (std::vector<std::string>{"global_step1", "global_step2"}));
  EXPECT_EQ(engine::latest_checkpoint_tag(checkpoints("full")), "global_step2");
  EXPECT_FALSE(fs::exists(checkpoints("full") / ".tmp-global_step3"));
}

// Recovery: the newest tag damaged three ways (a flipped byte, a truncated file, no manifest).
// The rerun moves it aside as <tag>.corrupt and resumes from the previous tag; stopped again and
// finished, it ends with the parameters of an uninterrupted run, bit for bit, and keeps only the
// .corrupt tag of its checkpoints.
TEST_F(SupervisedLoopTest, ADamagedNewestTagFallsBackToThePreviousOne) {
  RunOptions options;
  options.checkpoint_interval = 1;
  const Record straight = run("straight", options);
  const std::vector<std::pair<std::string, std::function<void(const fs::path&)>>> damages = {
      {"flipped",
       [](const fs::path& tag) {
         std::fstream file(tag / "rank0.safetensors", std::ios::in | std::ios::out | std::ios::binary);
         file.seekg(-16, std::ios::end);
         const char byte = static_cast<char>(file.get() ^ 0x5a);
         file.seekp(-16, std::ios::end);
         file.put(byte);
       }},
      {"truncated",
       [](const fs::path& tag) {
         const fs::path file = tag / "rank0.safetensors";
         fs::resize_file(file, fs::file_size(file) / 2);
       }},
      {"no_manifest", [](const fs::path& tag) { fs::remove(tag / "manifest.json"); }}};
  for (const auto& [name, damage] : damages) {
    SCOPED_TRACE(name);
    {
      CrashAfter crash(4);
      EXPECT_THROW(run(name, options), rlhf::Interrupted);
    }
    damage(checkpoints(name) / "global_step4");
    RunOptions perturbed = options;
    perturbed.perturb = true;  // only the checkpoint can undo it
    {
      CrashAfter crash(5);
      EXPECT_THROW(run(name, perturbed), rlhf::Interrupted);
    }
    EXPECT_TRUE(fs::is_directory(checkpoints(name) / "global_step4.corrupt"));
    std::vector<std::string> tags;
    for (const engine::CheckpointTag& tag : engine::list_checkpoint_tags(checkpoints(name))) tags.push_back(tag.tag);
    EXPECT_EQ(tags, (std::vector<std::string>{"global_step4", "global_step5"}));  // retrained from step 3
    const Record finished = run(name, perturbed);
    ASSERT_TRUE(finished.resumed.has_value());
    EXPECT_EQ(finished.global_steps, 5);
    // The finished step deletes its checkpoints but the damaged tag, kept for inspection, and its
    // last one (keep_last_checkpoint).
    EXPECT_TRUE(fs::is_directory(checkpoints(name) / "global_step4.corrupt"));
    EXPECT_TRUE(fs::is_directory(checkpoints(name) / "global_step5"));
    EXPECT_EQ(engine::latest_checkpoint_tag(checkpoints(name)), "global_step5");
    EXPECT_EQ(engine::list_checkpoint_tags(checkpoints(name)).size(), 1u);
    for (const auto& [param, value] : straight.parameters) {
      EXPECT_TRUE(torch::equal(finished.parameters.at(param), value)) << param;
    }
  }
}

std::vector<std::string> tag_names(const fs::path& dir) {
  std::vector<std::string> names;
  for (const engine::CheckpointTag& tag : engine::list_checkpoint_tags(dir)) names.push_back(tag.tag);
  return names;
}

// --resume-from: a missing tag is refused naming the ones there; a picked older tag is resumed
// from, the later tags are moved aside as <tag>.superseded (never deleted), and the run finishes
// bit-identical to an uninterrupted one.
TEST_F(SupervisedLoopTest, ResumeFromAPickedTagSetsTheLaterOnesAsideAndFinishesBitIdentical) {
  RunOptions options;
  options.checkpoint_interval = 1;
  options.keep_checkpoints = 0;
  const Record straight = run("straight", options);
  {
    CrashAfter crash(4);
    EXPECT_THROW(run("picked", options), rlhf::Interrupted);
  }
  RunOptions missing = options;
  missing.resume_from = "global_step9";
  EXPECT_THROW_WITH(run("picked", missing), core::NotFound,
                    "--resume-from global_step9: no such checkpoint in " + checkpoints("picked").string() +
                        "; it holds: global_step1 global_step2 global_step3 global_step4");
  RunOptions picked = options;
  picked.resume_from = "global_step2";
  picked.perturb = true;  // only the checkpoint can undo it
  {
    CrashAfter crash(3);
    EXPECT_THROW(run("picked", picked), rlhf::Interrupted);
  }
  EXPECT_TRUE(fs::is_directory(checkpoints("picked") / "global_step3.superseded"));
  EXPECT_TRUE(fs::is_directory(checkpoints("picked") / "global_step4.superseded"));
  EXPECT_EQ(tag_names(checkpoints("picked")), (std::vector<std::string>{"global_step1", "global_step2", "global_step3"}));
  RunOptions finish = options;
  finish.perturb = true;
  const Record finished = run("picked", finish);
  ASSERT_TRUE(finished.resumed.has_value());
  EXPECT_EQ(finished.global_steps, 5);
  for (const auto& [param, value] : straight.parameters) {
    EXPECT_TRUE(torch::equal(finished.parameters.at(param), value)) << param;
  }
}

// A background write that fails is reported at the next save (the run stops with its error), and
// `latest` still names the tag before it.
TEST_F(SupervisedLoopTest, AFailedBackgroundWriteStopsTheRunAtTheNextSave) {
  struct FailingWrite {
    FailingWrite() {
      engine::testing::set_checkpoint_write_hook([](const fs::path& staging) {
        if (staging.filename() == ".tmp-global_step3") throw core::IoError("injected write failure");
      });
    }
    ~FailingWrite() { engine::testing::set_checkpoint_write_hook(nullptr); }
  } failing;
  RunOptions options;
  options.checkpoint_interval = 1;
  EXPECT_THROW_WITH(run("failing", options), core::IoError, "injected write failure");
  EXPECT_EQ(engine::latest_checkpoint_tag(checkpoints("failing")), "global_step2");
  EXPECT_EQ(tag_names(checkpoints("failing")), (std::vector<std::string>{"global_step1", "global_step2"}));
  EXPECT_FALSE(fs::exists(checkpoints("failing") / ".tmp-global_step3"));
}

// Step 3's checkpoint spans three parts. A damaged critic (an engine part) or EMA (weights only)
// in the newest tag makes the whole tag unusable: it is moved aside in every part and every
// engine part's `latest` points at the previous tag.
TEST_F(SupervisedLoopTest, ADamagedCriticOrEmaPartOfTheNewestTagFallsBackToThePreviousOne) {
  const std::vector<std::pair<std::string, std::function<void(const fs::path&)>>> damages = {
      {"critic",
       [](const fs::path& ckpt) {
         std::fstream file(ckpt / "critic/global_step2/rank0.safetensors",
                           std::ios::in | std::ios::out | std::ios::binary);
         file.seekg(-8, std::ios::end);
         const char byte = static_cast<char>(file.get() ^ 0x5a);
         file.seekp(-8, std::ios::end);
         file.put(byte);
       }},
      {"ema", [](const fs::path& ckpt) {
         const fs::path file = ckpt / "ema/global_step2/model.safetensors";
         fs::resize_file(file, fs::file_size(file) - 4);
       }}};
  for (const auto& [part, damage] : damages) {
    SCOPED_TRACE(part);
    rlhf::CommonStepConfig common;
    rlhf::StepContext context;
    rlhf::StepRunner runner("step 3 (PPO)", tmp_ / ("ppo_" + part), common, context);
    runner.set_checkpoint_parts({"actor", "critic", "ema"});
    torch::manual_seed(5);
    auto actor = std::make_shared<torch::nn::LinearImpl>(4, 3);
    auto critic = std::make_shared<torch::nn::LinearImpl>(4, 1);
    engine::TrainingEngineOptions engine_options;
    engine_options.config = engine::DeepSpeedConfig::parse(
        {{"train_batch_size", 1}, {"train_micro_batch_size_per_gpu", 1}}, 1, "test");
    engine::TrainingEngine actor_engine(actor, engine_options), critic_engine(critic, engine_options);
    for (const std::string tag : {"global_step1", "global_step2"}) {
      runner.save_checkpoint([&](engine::AsyncCheckpointWriter* background) {
        critic_engine.save_checkpoint(runner.checkpoint_dir() / "critic", tag, json::object(), background);
        io::save_state_dict(runner.checkpoint_dir() / "ema" / tag, {{"weight", actor->weight.detach().clone()}});
        actor_engine.save_checkpoint(runner.checkpoint_dir() / "actor", tag, json::object(), background);
      }, /*wait=*/true);
    }
    damage(runner.checkpoint_dir());
    ASSERT_TRUE(runner.prepare_resume());
    for (const char* p : {"actor", "critic"}) {
      EXPECT_EQ(engine::latest_checkpoint_tag(runner.checkpoint_dir() / p), "global_step1") << p;
    }
    for (const char* p : {"actor", "critic", "ema"}) {
      EXPECT_TRUE(fs::is_directory(runner.checkpoint_dir() / p / "global_step2.corrupt")) << p;
      EXPECT_TRUE(fs::is_directory(runner.checkpoint_dir() / p / "global_step1")) << p;
    }
  }
}

TEST_F(SupervisedLoopTest, AStoppedAndResumedRunEndsBitIdenticalToAnUninterruptedOne) {
  RunOptions options;
  options.checkpoint_interval = 1;
  const Record straight = run("straight", options);
  {
    CrashAfter crash(3);
    EXPECT_THROW(run("resumed", options), rlhf::Interrupted);
  }
  ASSERT_TRUE(fs::exists(checkpoints("resumed") / "latest"));
  options.perturb = true;
  const Record second = run("resumed", options);

  ASSERT_TRUE(second.resumed.has_value());
  EXPECT_EQ(second.resumed->epoch, 1);        // step 3 ended at epoch 1's first micro-batch
  EXPECT_EQ(second.resumed->micro_batch, 1);
  EXPECT_EQ(second.resumed->client_state.at("marker"), "toy");  // the hook's keys came back
  EXPECT_EQ(second.resumed->client_state.at("evaluations"), 2);  // before training + epoch 0's end
  const std::vector<std::string> events = {"resume e1 b1", "step 4", "step 5", "epoch_end 1", "eval epoch_end e1 s5",
                                           "save_model"};
  EXPECT_EQ(second.events, events);  // no evaluation before training on a resume
  EXPECT_EQ(second.global_steps, 5);
  ASSERT_EQ(second.losses.size(), 4u);  // epoch 1's first micro-batch was skipped
  ASSERT_EQ(straight.losses.size(), 10u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(second.losses[i], straight.losses[6 + i]) << "micro-batch " << 6 + i;
  ASSERT_EQ(second.parameters.size(), straight.parameters.size());
  for (const auto& [name, value] : straight.parameters) {
    EXPECT_TRUE(torch::equal(second.parameters.at(name), value)) << name;
  }
}

TEST_F(SupervisedLoopTest, ARunResumedAfterItsLastEpochOnlyReevaluatesAndSaves) {
  RunOptions failing;
  failing.fail_save = true;
  EXPECT_THROW(run("ended", failing), std::runtime_error);
  // The last epoch's end checkpoint survives the failed save.
  ASSERT_TRUE(fs::exists(checkpoints("ended") / "latest"));
  const Record again = run("ended", RunOptions());
  ASSERT_TRUE(again.resumed.has_value());
  EXPECT_EQ(again.resumed->client_state.at("epoch"), 2);
  EXPECT_EQ(again.resumed->client_state.at("batch"), 0);
  EXPECT_EQ(again.resumed->client_state.at("evaluations"), 3);  // before + both epoch ends
  const std::vector<std::string> events = {"resume e2 b0", "eval resumed_at_end e2 s5", "save_model"};
  EXPECT_EQ(again.events, events);
  EXPECT_TRUE(again.losses.empty());
  EXPECT_TRUE(fs::exists(checkpoints("ended") / "latest"));  // its last checkpoint stays (keep_last_checkpoint)
}

TEST_F(SupervisedLoopTest, RefusesAClientStateThatWouldOverwriteThePosition) {
  RunOptions options;
  options.checkpoint_interval = 1;
  options.extra_client_state = {{"batch", 99}};
  EXPECT_THROW_WITH(run("clash", options), core::InvalidArgument, "'epoch', 'batch', 'guardian' and 'data_layout'");
}

}  // namespace
}  // namespace dschat
