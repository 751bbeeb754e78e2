// The built-in CNN presets as graphs (compute/network.h's expand_presets builds them by name):
// small-cnn, and torchvision's resnet18 and resnet50 with its parameter names.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessera {

// conv, pool, conv, pool, dense, dropout, dense; channels w, 2w and 4w.
nlohmann::json small_cnn(int classes, int width);
// A ResNet of basic blocks or bottlenecks, `blocks` per stage.
nlohmann::json resnet(const std::string& name, int classes, bool bottleneck, const std::vector<int>& blocks);

}  // namespace tessera
