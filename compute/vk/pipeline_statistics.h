// What the driver says of a compiled pipeline (VK_KHR_pipeline_executable_properties): per
// executable, its statistics (NVIDIA: registers, shared memory, spills...). On a GPU these answer
// what a disassembly would (did the accumulators stay in registers?), with no vendor tool.
// Collected when TESSERA_PIPELINE_STATISTICS=1 and the device offers the extension.
#pragma once
#include <nlohmann/json.hpp>
#include <vulkan/vulkan.h>

namespace tessera::vk {

// The extension's name, which the device enables for the feature below.
inline constexpr const char* kPipelineStatisticsExtension = VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME;

// {"executables": [{"name", "statistics": {name: value}}]} of a pipeline made with
// VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR.
nlohmann::json pipeline_statistics(VkDevice device, VkPipeline pipeline);

}  // namespace tessera::vk
