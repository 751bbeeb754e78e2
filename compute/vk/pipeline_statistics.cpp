#include "compute/vk/pipeline_statistics.h"

#include <vector>

#include "compute/vk/context.h"

namespace tessera::vk {

namespace {
nlohmann::json statistic_value(const VkPipelineExecutableStatisticKHR& statistic) {
  switch (statistic.format) {
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR: return statistic.value.b32 != 0;
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR: return statistic.value.i64;
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR: return statistic.value.u64;
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR: return statistic.value.f64;
    default: return nullptr;
  }
}
}  // namespace

nlohmann::json pipeline_statistics(VkDevice device, VkPipeline pipeline) {
  auto properties_of = reinterpret_cast<PFN_vkGetPipelineExecutablePropertiesKHR>(
      vkGetDeviceProcAddr(device, "vkGetPipelineExecutablePropertiesKHR"));
  auto statistics_of = reinterpret_cast<PFN_vkGetPipelineExecutableStatisticsKHR>(
      vkGetDeviceProcAddr(device, "vkGetPipelineExecutableStatisticsKHR"));
  nlohmann::json executables = nlohmann::json::array();
  if (!properties_of || !statistics_of) return {{"executables", executables}};
  VkPipelineInfoKHR info{VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR};
  info.pipeline = pipeline;
  uint32_t count = 0;
  check(properties_of(device, &info, &count, nullptr), "vkGetPipelineExecutablePropertiesKHR");
  std::vector<VkPipelineExecutablePropertiesKHR> properties(count, {VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_PROPERTIES_KHR});
  check(properties_of(device, &info, &count, properties.data()), "vkGetPipelineExecutablePropertiesKHR");
  for (uint32_t e = 0; e < count; ++e) {
    VkPipelineExecutableInfoKHR executable{VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR};
    executable.pipeline = pipeline;
    executable.executableIndex = e;
    uint32_t statistic_count = 0;
    check(statistics_of(device, &executable, &statistic_count, nullptr), "vkGetPipelineExecutableStatisticsKHR");
    std::vector<VkPipelineExecutableStatisticKHR> statistics(statistic_count,
                                                             {VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR});
    check(statistics_of(device, &executable, &statistic_count, statistics.data()),
          "vkGetPipelineExecutableStatisticsKHR");
    nlohmann::json values = nlohmann::json::object();
    for (const auto& statistic : statistics) values[statistic.name] = statistic_value(statistic);
    executables.push_back({{"name", properties[e].name}, {"statistics", values}});
  }
  return {{"executables", executables}};
}

}  // namespace tessera::vk
