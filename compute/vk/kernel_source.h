// A kernel as the build embeds it: the SPIR-V that glslc compiled from shaders/<name>.comp, and
// its name (for messages and profiles). cmake/shaders.cmake generates a constant of these per
// kernel (compute/vk/kernel_names.h: vk::kernel::<name>), so kernels are never named by strings.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tessera::vk {

struct ShaderBinary {
  const uint32_t* words;
  size_t word_count;
};

struct KernelSource {
  std::string_view name;
  const ShaderBinary* spirv;
};

// A kernel that stores activations, compiled for float (f32) and fp16 activations (f16) from one
// source; compute/op.h's kernel_for picks one by the activation tensor's type.
struct ActivationKernel {
  KernelSource f32, f16;
};

// An ActivationKernel whose operand B is an imageBuffer (shaders/common.glsl's B_TEXELS), whose
// format SPIR-V fixes: compiled again for an fp16 B (b16); op.h's kernel_for picks by B's type.
struct OperandKernel {
  ActivationKernel b32, b16;
};

}  // namespace tessera::vk
