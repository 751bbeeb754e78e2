// Ops by type name, built from a layer of a model description.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "compute/op.h"

namespace tessera {

// A model description that cannot be built: names the layer and the field (exit 5).
struct ModelError : BadInput {
  using BadInput::BadInput;
};

// The largest whole number a layer's field may hold (channels, features, kernel, stride, padding,
// heads, tokens of a grid). Vulkan guarantees 65535 workgroups a dispatch dimension and no more;
// ops dispatch one workgroup per channel (batch norm, bias gradients), so a larger field would
// plan and then fail inside the kernel. No real model comes near: ViT-22B is 6144 wide with
// 24576 hidden features, and a class count is a tile label (below 65536).
constexpr int64_t kMaxLayerInteger = 65535;

// One layer of a model description ({"name": "conv1", "type": "conv2d", "out_channels": 64, ...})
// with typed reads that name the layer and the field when a value is missing or malformed.
class LayerConfig {
 public:
  explicit LayerConfig(const nlohmann::json& layer);
  const std::string& name() const { return name_; }
  const std::string& type() const { return type_; }
  const nlohmann::json& json() const { return layer_; }

  // At most `maximum`: by default kMaxLayerInteger.
  int64_t integer(const char* field, std::optional<int64_t> fallback = std::nullopt, int64_t minimum = 0,
                  int64_t maximum = kMaxLayerInteger) const;
  double number(const char* field, std::optional<double> fallback = std::nullopt) const;
  // An array of as many numbers as `fallback` holds.
  std::vector<double> numbers(const char* field, std::vector<double> fallback) const;
  bool boolean(const char* field, std::optional<bool> fallback = std::nullopt) const;
  // One of `allowed` (a string).
  std::string choice(const char* field, const std::string& fallback, const std::vector<std::string>& allowed) const;
  [[noreturn]] void fail(const std::string& field, const std::string& problem) const;
  // Throws naming the first field that no read asked for.
  void refuse_unread() const;

 private:
  const nlohmann::json* find(const char* field) const;
  nlohmann::json layer_;
  mutable std::set<std::string> read_;  // fields the op asked for: any other is unknown
  std::string name_, type_;
};

std::unique_ptr<Op> make_op(const LayerConfig& layer);

// A layer of a model description, as the presets write them: {"name", "type", fields...,
// "inputs"} (inputs left out: the layer before).
nlohmann::json layer_description(const std::string& name, const std::string& type,
                                 nlohmann::json fields = nlohmann::json::object(),
                                 std::vector<std::string> inputs = {});

}  // namespace tessera
