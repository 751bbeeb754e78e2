// Host <-> device transfers as a discrete GPU needs them: uploads and read-backs through staging
// buffers where device memory cannot be mapped, flushes after host writes and invalidates before
// host reads where host memory is not coherent. On plain lavapipe these take the mapped paths;
// under VK_LAYER_TESSERA_discrete_gpu (tools/run-tests.sh's second run) the discrete ones.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "compute/tensor.h"
#include "compute/vk/context.h"
#include "compute/vk/recorder.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

bool discrete(vk::Context& context) { return context.info().type == "discrete-gpu"; }

// Whether the allocator's staging memory (host-visible, cached first) is not coherent.
bool staging_is_not_coherent(vk::Context& context) {
  VkPhysicalDeviceMemoryProperties memory;
  vkGetPhysicalDeviceMemoryProperties(context.physical_device(), &memory);
  const VkMemoryPropertyFlags cached = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_CACHED_BIT;
  for (uint32_t t = 0; t < memory.memoryTypeCount; ++t)
    if ((memory.memoryTypes[t].propertyFlags & cached) == cached)
      return !(memory.memoryTypes[t].propertyFlags & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT);
  return false;
}

std::vector<float> ramp(size_t n, float start) {
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = start + static_cast<float>(i) * 0.25f;
  return values;
}

void run(vk::Context& context, auto&& record) {
  vk::Program program(context);
  {
    vk::Recorder recorder(context, program);
    record(recorder);
    recorder.finish();
  }
  program.run();
}

TEST(DiscreteMemory, DeviceTensorsAreMappedOnlyWithOneHeap) {
  auto& context = test::context();
  Tensor tensor(context, "t", {5});
  if (discrete(context)) {
    EXPECT_EQ(tensor.buffer().mapped(), nullptr) << "a discrete GPU's device-local memory is not host-visible";
    EXPECT_EQ(context.allocator().device_footprint(20, vk::MemoryUsage::staging), 0u) << "staging is the host's memory";
  } else {
    EXPECT_NE(tensor.buffer().mapped(), nullptr);
  }
}

// Sizes and offsets off every atom: uploads of part of a tensor keep the rest.
TEST(DiscreteMemory, UploadsAndDownloadsOfOddRangesRoundTrip) {
  auto& context = test::context();
  const size_t n = 12345;
  Tensor tensor(context, "odd", {static_cast<int64_t>(n)});
  auto values = ramp(n, 1);
  tensor.upload(values);
  auto part = ramp(37, -100);
  tensor.upload(part.data(), part.size() * sizeof(float), 1001 * sizeof(float));
  for (size_t i = 0; i < part.size(); ++i) values[1001 + i] = part[i];
  EXPECT_EQ(tensor.download(), values);
  std::vector<float> middle(53);
  tensor.download(middle.data(), middle.size() * sizeof(float), 999 * sizeof(float));
  EXPECT_EQ(middle, std::vector<float>(values.begin() + 999, values.begin() + 999 + 53));
}

// A staged input written by the host each step, and a result the device writes into host memory.
TEST(DiscreteMemory, StagedTensorsCarryHostWritesAndDeviceWrites) {
  auto& context = test::context();
  const size_t n = 1000;
  Tensor staged(context, "staged", {static_cast<int64_t>(n)}, DType::f32, vk::MemoryUsage::staging);
  Tensor device(context, "device", {static_cast<int64_t>(n)});
  Tensor result(context, "result", {static_cast<int64_t>(n)}, DType::f32, vk::MemoryUsage::staging);
  for (float start : {1.0f, 2.0f}) {  // the second step rewrites what the first flushed
    auto values = ramp(n, start);
    staged.buffer().write(values.data(), values.size() * sizeof(float));
    run(context, [&](vk::Recorder& recorder) {
      recorder.copy(staged.buffer(), 0, device.buffer(), 0, staged.bytes());
      recorder.copy(device.buffer(), 0, result.buffer(), 0, staged.bytes());
    });
    std::vector<float> seen(n);
    result.buffer().read(seen.data(), result.bytes());
    EXPECT_EQ(seen, values) << "step from " << start;
    EXPECT_EQ(device.download(), values);
  }
}

// TESSERA_FAULT=skip_flush makes tessera forget its flushes: harmless where host memory is coherent
// (plain lavapipe), wrong numbers where it is not (the layer). The layer must catch it.
TEST(DiscreteMemory, ASkippedFlushIsCaughtWhereHostMemoryIsNotCoherent) {
  setenv("TESSERA_FAULT", "skip_flush", 1);
  auto context = std::make_unique<vk::Context>();
  unsetenv("TESSERA_FAULT");
  const size_t n = 4096;
  auto values = ramp(n, 3);
  std::vector<float> seen;
  {
    Tensor staged(*context, "staged", {static_cast<int64_t>(n)}, DType::f32, vk::MemoryUsage::staging);
    Tensor device(*context, "device", {static_cast<int64_t>(n)});
    staged.buffer().write(values.data(), values.size() * sizeof(float));  // its flush is skipped
    run(*context, [&](vk::Recorder& recorder) {
      recorder.copy(staged.buffer(), 0, device.buffer(), 0, staged.bytes());
    });
    seen = device.download();
  }
  if (staging_is_not_coherent(*context))
    EXPECT_NE(seen, values) << "the device saw host writes that were never flushed";
  else
    EXPECT_EQ(seen, values);
  EXPECT_EQ(context->validation_messages(), 0u);
}

// The same fault in an ordinary op test, run as a child under this process's layers (the
// environment carries VK_INSTANCE_LAYERS): its comparison with the CPU fails where host memory is
// not coherent, because the inputs never reach the device, and passes where it is.
TEST(DiscreteMemory, AnOpTestWithoutItsFlushesFailsWhereHostMemoryIsNotCoherent) {
  const bool not_coherent = staging_is_not_coherent(test::context());
  auto op_test = std::filesystem::read_symlink("/proc/self/exe").parent_path() / "test_op_linear";
  std::string command = "TESSERA_FAULT=skip_flush '" + op_test.string() + "' --gtest_filter=Linear.ForwardMatchesCpu 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char chunk[4096];
  while (size_t n = std::fread(chunk, 1, sizeof chunk, pipe)) output.append(chunk, n);
  int status = pclose(pipe);
  ASSERT_TRUE(WIFEXITED(status)) << output;  // a failed comparison, never a crash
  if (not_coherent) {
    EXPECT_EQ(WEXITSTATUS(status), 1) << output;
    EXPECT_NE(output.find("[  FAILED  ] Linear.ForwardMatchesCpu"), std::string::npos) << output;
  } else {
    EXPECT_EQ(WEXITSTATUS(status), 0) << output;
  }
  EXPECT_EQ(output.find("validation"), std::string::npos) << output;
}

}  // namespace
}  // namespace tessera
