// SPIR-V of the shaders in shaders/, compiled by glslc at build time and embedded.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tessera::vk {

struct ShaderBinary {
  const uint32_t* words;
  size_t word_count;
};

// The shader compiled from shaders/<name>.comp, or nullptr.
const ShaderBinary* find_shader(std::string_view name);

}  // namespace tessera::vk
