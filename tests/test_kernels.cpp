// Each kernel's push-constant block and specialization constants are read from its SPIR-V and
// checked when its pipeline is made: a C++ push struct of another size, or another number of
// constants, is an error naming the kernel, not a dispatch that reads garbage.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/error.h"
#include "compute/vk/context.h"
#include "compute/tensor.h"
#include "compute/vk/kernels.h"
#include "compute/vk/recorder.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

// shaders/conv2d_forward_weight.comp: push { uint rows, columns, count; float eps; }, and the
// workgroup size, BLOCK and FOLD as specialization constants 0, 1 and 2.
struct WeightPush {
  uint32_t rows, columns, count;
  float eps;
};
const std::vector<int32_t> kWeightConstants{256, 16, 0};

std::string error_of(const std::function<void()>& make) {
  try {
    make();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Kernels, APipelineMadeForThePushBlockItDeclares) {
  auto& kernels = test::context().kernels();
  auto pipeline = kernels.get<WeightPush>(vk::kernel::conv2d_forward_weight.f32, kWeightConstants);
  EXPECT_EQ(pipeline.kernel().push_bytes, sizeof(WeightPush));
  EXPECT_EQ(pipeline.kernel().name, "conv2d_forward_weight");
  // A kernel without push constants.
  EXPECT_EQ(kernels.get(vk::kernel::optimizer_step).kernel().push_bytes, 0u);
}

TEST(Kernels, APushBlockOfAnotherSizeIsAnErrorNamingTheKernel) {
  auto& kernels = test::context().kernels();
  struct Short {
    uint32_t rows, columns, count;  // eps forgotten
  };
  std::string message = error_of([&] { kernels.get<Short>(vk::kernel::conv2d_forward_weight.f32, kWeightConstants); });
  EXPECT_NE(message.find("conv2d_forward_weight"), std::string::npos) << message;
  EXPECT_NE(message.find("16 bytes"), std::string::npos) << message;
  EXPECT_NE(message.find("made for 12"), std::string::npos) << message;
  // Once the right pipeline exists, a caller with the wrong struct is refused all the same.
  kernels.get<WeightPush>(vk::kernel::conv2d_forward_weight.f32, kWeightConstants);
  EXPECT_THROW(kernels.get<Short>(vk::kernel::conv2d_forward_weight.f32, kWeightConstants), Error);
  // Push constants where the kernel declares none, and none where it declares them.
  EXPECT_THROW(kernels.get<WeightPush>(vk::kernel::optimizer_step), Error);
  EXPECT_THROW(kernels.get(vk::kernel::conv2d_forward_weight.f32, kWeightConstants), Error);
}

TEST(Kernels, AnotherNumberOfSpecializationConstantsIsAnErrorNamingTheKernel) {
  auto& kernels = test::context().kernels();
  std::string message = error_of([&] { kernels.get<WeightPush>(vk::kernel::conv2d_forward_weight.f32, {256, 16}); });
  EXPECT_NE(message.find("conv2d_forward_weight"), std::string::npos) << message;
  EXPECT_NE(message.find("reads 3 specialization constants"), std::string::npos) << message;
  EXPECT_THROW(kernels.get<WeightPush>(vk::kernel::conv2d_forward_weight.f32, {256, 16, 0, 1}), Error);
  EXPECT_EQ(test::context().validation_messages(), 0u);
}

// The fp16 variant is a member of the kernel's constant, chosen by type, never by a name suffix.
TEST(Kernels, AnActivationKernelHoldsBothVariants) {
  EXPECT_EQ(vk::kernel::relu_forward.f32.name, "relu_forward");
  EXPECT_EQ(vk::kernel::relu_forward.f16.name, "relu_forward_f16");
  EXPECT_NE(vk::kernel::relu_forward.f32.spirv, vk::kernel::relu_forward.f16.spirv);
}

// A dispatch past the device's maxComputeWorkGroupCount never reaches the driver (undefined
// behaviour on a GPU): the recorder refuses it naming the kernel and the layer recording it.
// Plans refuse every such layer first (compute/ops/gemm.h, registry.h); this is the backstop.
TEST(Kernels, ADispatchPastTheDevicesWorkgroupCountIsRefused) {
  auto& context = test::context();
  const uint32_t most = context.properties().limits.maxComputeWorkGroupCount[1];
  Tensor step(context, "step", {1}, DType::u32);
  vk::Program program(context);
  vk::Recorder recorder(context, program);
  recorder.set_scope("fc");
  auto& kernels = context.kernels();
  std::string message;
  try {
    recorder.dispatch(kernels.get(vk::kernel::optimizer_step), {vk::updates(step.buffer())}, 1, most + 1);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::bad_input);
    message = e.what();
  }
  EXPECT_EQ(message, "kernel optimizer_step (fc): " + std::to_string(most + 1) + " workgroups in y, more than the "
                     "device's " + std::to_string(most) + ": a layer too large for its kernel");
  recorder.finish();
  EXPECT_EQ(context.validation_messages(), 0u);
}

}  // namespace
}  // namespace tessera
