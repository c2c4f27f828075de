#pragma once
// Tensor-parallel ranks as threads of one process (tensor_parallel_test.cpp,
// continuous_tp_test.cpp): a FakeGroup's all_reduce_sum adds the ranks' tensors through a
// SharedSum, so every rank receives the same bits, as from a real all-reduce.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "dschat/nn/tensor_parallel.h"

namespace dschat {
namespace testing {

// A sum over `size` threads: each adds its tensor, the last one publishes the result.
class SharedSum {
 public:
  explicit SharedSum(int64_t size) : size_(size) {}
  void sum(torch::Tensor& t) {
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t round = round_;
    accumulated_ = arrived_ == 0 ? t.clone() : accumulated_ + t;
    if (++arrived_ == size_) {
      result_ = accumulated_;
      arrived_ = 0;
      ++round_;
      done_.notify_all();
    } else {
      // A rank that failed never arrives: time out rather than hang the test.
      if (!done_.wait_for(lock, std::chrono::seconds(60), [&] { return round_ != round; })) {
        throw std::runtime_error("SharedSum: the other ranks did not arrive within 60 s");
      }
    }
    t.copy_(result_);
  }

 private:
  int64_t size_, arrived_ = 0, round_ = 0;
  std::mutex mutex_;
  std::condition_variable done_;
  torch::Tensor accumulated_, result_;  // [...] shaped as the tensors being summed
};

class FakeGroup : public nn::TensorParallelGroup {
 public:
  FakeGroup(int64_t rank, int64_t size, std::shared_ptr<SharedSum> sum = nullptr)
      : rank_(rank), size_(size), sum_(std::move(sum)) {}
  int64_t rank() const override { return rank_; }
  int64_t size() const override { return size_; }
  void all_reduce_sum(torch::Tensor& t) override {
    ASSERT_NE(sum_, nullptr) << "this fake group cannot reduce";
    sum_->sum(t);
  }

 private:
  int64_t rank_, size_;
  std::shared_ptr<SharedSum> sum_;
};

}  // namespace testing
}  // namespace dschat
