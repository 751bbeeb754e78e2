#include "compute/cnn_presets.h"

#include "compute/ops/registry.h"

namespace tessera {

// conv, pool, conv, pool, dense, dropout, dense; channels w, 2w and 4w.
nlohmann::json small_cnn(int classes, int width) {
  nlohmann::json layers = nlohmann::json::array();
  layers.push_back(layer_description("conv1", "conv2d", {{"out_channels", width}, {"kernel", 3}, {"padding", 1}}));
  layers.push_back(layer_description("relu1", "relu"));
  layers.push_back(layer_description("pool1", "max_pool2d", {{"kernel_size", 2}}));
  layers.push_back(layer_description("conv2", "conv2d", {{"out_channels", 2 * width}, {"kernel", 3}, {"padding", 1}}));
  layers.push_back(layer_description("relu2", "relu"));
  layers.push_back(layer_description("pool2", "max_pool2d", {{"kernel_size", 2}}));
  layers.push_back(layer_description("flatten", "flatten"));
  layers.push_back(layer_description("fc1", "linear", {{"out_features", 4 * width}}));
  layers.push_back(layer_description("relu3", "relu"));
  layers.push_back(layer_description("dropout", "dropout", {{"p", 0.5}}));
  layers.push_back(layer_description("fc2", "linear", {{"out_features", classes}}));
  return {{"name", "small-cnn"}, {"layers", layers}};
}

// torchvision's resnet18 (basic blocks) and resnet50 (bottlenecks, stride on the 3x3 conv as
// torchvision's v1.5): the names of parameters match its state_dict. A block's layers end in
// "<stage>.<block>.relu<last>", so that "layer1.0" and "layer1" name the outputs PyTorch's
// modules of those names give (see Network::layer).
nlohmann::json resnet(const std::string& name, int classes, bool bottleneck, const std::vector<int>& blocks) {
  nlohmann::json layers = nlohmann::json::array();
  auto conv = [](const std::string& conv_name, int out, int kernel, int stride, int padding, std::string input) {
    return layer_description(
        conv_name, "conv2d",
        {{"out_channels", out}, {"kernel", kernel}, {"stride", stride}, {"padding", padding}, {"bias", false}},
        {std::move(input)});
  };
  layers.push_back(conv("conv1", 64, 7, 2, 3, "input"));
  layers.push_back(layer_description("bn1", "batch_norm2d"));
  layers.push_back(layer_description("relu", "relu"));
  layers.push_back(layer_description("maxpool", "max_pool2d", {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}}));
  std::string previous = "maxpool";
  int channels = 64;
  const int expansion = bottleneck ? 4 : 1;
  for (int stage = 1; stage <= static_cast<int>(blocks.size()); ++stage) {
    int width = 64 << (stage - 1), out = width * expansion;
    for (int block = 0; block < blocks[static_cast<size_t>(stage - 1)]; ++block) {
      std::string prefix = "layer" + std::to_string(stage) + "." + std::to_string(block) + ".";
      int stride = (stage > 1 && block == 0) ? 2 : 1;
      // Basic: 3x3 (stride), 3x3. Bottleneck: 1x1, 3x3 (stride), 1x1 to width * 4.
      std::vector<std::pair<int, int>> convs;  // (kernel, stride)
      if (bottleneck)
        convs = {{1, 1}, {3, stride}, {1, 1}};
      else
        convs = {{3, stride}, {3, 1}};
      std::string branch = previous;
      for (size_t c = 0; c < convs.size(); ++c) {
        auto index = std::to_string(c + 1);
        bool last = c + 1 == convs.size();
        auto [kernel, conv_stride] = convs[c];
        layers.push_back(conv(prefix + "conv" + index, last ? out : width, kernel, conv_stride, kernel / 2, branch));
        layers.push_back(layer_description(prefix + "bn" + index, "batch_norm2d"));
        branch = prefix + "bn" + index;
        if (!last) {
          layers.push_back(layer_description(prefix + "relu" + index, "relu"));
          branch = prefix + "relu" + index;
        }
      }
      std::string identity = previous;
      if (stride != 1 || channels != out) {
        layers.push_back(conv(prefix + "downsample.0", out, 1, stride, 0, previous));
        layers.push_back(layer_description(prefix + "downsample.1", "batch_norm2d"));
        identity = prefix + "downsample.1";
      }
      layers.push_back(layer_description(prefix + "add", "add", {}, {branch, identity}));
      previous = prefix + "relu" + std::to_string(convs.size());
      layers.push_back(layer_description(previous, "relu"));
      channels = out;
    }
  }
  layers.push_back(layer_description("avgpool", "global_avg_pool"));
  layers.push_back(layer_description("fc", "linear", {{"out_features", classes}}));
  return {{"name", name}, {"layers", layers}};
}

}  // namespace tessera
