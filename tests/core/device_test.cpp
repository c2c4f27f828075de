// core::resolve_device over every kind of machine (inventories built by hand, so a CPU-only CI
// covers the GPU branches), and over this process's real one.
#include <gtest/gtest.h>

#include "dschat/core/device.h"
#include "dschat/core/error.h"
#include "test_util.h"

namespace dschat {
namespace {

using core::DeviceInventory;
using core::resolve_device;

const DeviceInventory kNoCudaBuild{false, 0};
const DeviceInventory kNoGpu{true, 0};
const DeviceInventory kTwoGpus{true, 2};

TEST(Device, CpuIsAlwaysTheCpu) {
  for (const auto& inventory : {kNoCudaBuild, kNoGpu, kTwoGpus}) {
    EXPECT_EQ(resolve_device("cpu", "--device", -1, inventory), torch::Device(torch::kCPU));
    EXPECT_EQ(resolve_device("cpu", "--device", 1, inventory), torch::Device(torch::kCPU));
  }
}

TEST(Device, AutoPicksTheGpuWhenThereIsOne) {
  EXPECT_EQ(resolve_device("auto", "--device", -1, kNoCudaBuild), torch::Device(torch::kCPU));
  EXPECT_EQ(resolve_device("auto", "--device", -1, kNoGpu), torch::Device(torch::kCPU));
  EXPECT_EQ(resolve_device("auto", "--device", -1, kTwoGpus), torch::Device(torch::kCUDA, 0));
  EXPECT_EQ(resolve_device("auto", "--device", 1, kTwoGpus), torch::Device(torch::kCUDA, 1));  // LOCAL_RANK 1
}

TEST(Device, CudaFollowsLocalRankAndCudaNIsExplicit) {
  EXPECT_EQ(resolve_device("cuda", "--device", -1, kTwoGpus), torch::Device(torch::kCUDA, 0));
  EXPECT_EQ(resolve_device("cuda", "--device", 1, kTwoGpus), torch::Device(torch::kCUDA, 1));
  EXPECT_EQ(resolve_device("cuda:1", "--device", 0, kTwoGpus), torch::Device(torch::kCUDA, 1));
  EXPECT_EQ(resolve_device("cuda:0", "--device", -1, kTwoGpus), torch::Device(torch::kCUDA, 0));
}

TEST(Device, MissingCudaSaysWhatIsMissing) {
  EXPECT_THROW_WITH(resolve_device("cuda", "--device", -1, kNoCudaBuild), core::ConfigError,
                    "--device: 'cuda' needs CUDA, but this dschat build has no CUDA");
  EXPECT_THROW_WITH(resolve_device("cuda:0", "step1: key 'device'", -1, kNoGpu), core::ConfigError,
                    "step1: key 'device': 'cuda:0' needs a GPU, but none is visible");
  EXPECT_THROW_WITH(resolve_device("cuda:2", "--device", -1, kTwoGpus), core::ConfigError,
                    "--device: cuda:2 is out of range: 2 GPU(s) are visible");
  EXPECT_THROW_WITH(resolve_device("cuda", "--device", 3, kTwoGpus), core::ConfigError,
                    "'cuda' on local rank 3 means cuda:3, but only 2 GPU(s) are visible");
  EXPECT_THROW_WITH(resolve_device("auto", "--device", 2, kTwoGpus), core::ConfigError,
                    "'auto' on local rank 2 means cuda:2");
}

TEST(Device, BadNamesAreRefused) {
  for (const std::string bad : {"", "gpu", "cuda:", "cuda:x", "cuda:-1", "Cuda", "cpu:0", "cuda:99999999"}) {
    EXPECT_FALSE(core::is_device_name(bad)) << bad;
    EXPECT_THROW_WITH(resolve_device(bad, "--device", -1, kTwoGpus), core::ConfigError,
                      "--device: '" + bad + "' is not a device (auto, cpu, cuda or cuda:N)");
  }
  for (const std::string good : {"auto", "cpu", "cuda", "cuda:0", "cuda:15"}) EXPECT_TRUE(core::is_device_name(good));
}

// This process: auto is the GPU exactly when LibTorch sees one.
TEST(Device, AutoMatchesThisMachine) {
  const torch::Device device = resolve_device("auto", "--device");
  EXPECT_EQ(device.is_cuda(), DeviceInventory::from_runtime().cuda_devices > 0);
  EXPECT_NE(core::describe_device(device).find(device.is_cuda() ? "cuda:0" : "cpu"), std::string::npos);
  if (!device.is_cuda()) {
    EXPECT_THROW(resolve_device("cuda", "--device"), core::ConfigError);
    EXPECT_NO_THROW(core::set_current_device(device));
  }
}

// A bare "cuda" gets the index its tensors report; anything indexed or on the CPU is kept.
TEST(Device, IndexedDeviceNamesTheCurrentGpu) {
  EXPECT_EQ(core::indexed_device(torch::kCPU), torch::Device(torch::kCPU));
  EXPECT_EQ(core::indexed_device(torch::Device("cuda:3")), torch::Device("cuda:3"));
  if (torch::cuda::is_available()) {
    const torch::Device indexed = core::indexed_device(torch::kCUDA);
    EXPECT_TRUE(indexed.has_index());
    EXPECT_EQ(indexed, torch::empty({1}, torch::kCUDA).device());
  }
}

}  // namespace
}  // namespace dschat
