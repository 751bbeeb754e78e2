// The epilogue of GEMM-like ops (compute/op.h's Epilogue): each fused pair or chain of layers
// against the same graph with fusion off (Network::set_fusion), as an inference job runs it
// (prepared weights), for every GEMM kernel variant that runs on the device (gemm.comp,
// gemm_quads.comp, gemm_tiled.comp; conv2d_forward and conv2d_forward_tiled), in fp32 and fp16,
// at sizes that are no multiple of any tile. The unfused graph is the reference: each of its ops
// is checked against the CPU in its own test (test_op_*), and every op here computes in float.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>

#include "compute/network.h"
#include "compute/ops/gemm.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

nlohmann::json layer(const std::string& name, const std::string& type, nlohmann::json fields = nlohmann::json::object(),
                     std::vector<std::string> inputs = {}) {
  fields["name"] = name;
  fields["type"] = type;
  if (!inputs.empty()) fields["inputs"] = inputs;
  return fields;
}

// The output of `description` over random graph inputs of these shapes ("input", then "skip":
// a residual), every parameter and batch norm statistic random, weights prepared; the layers
// that run inside another's store are `expect_fused` where fusion is on.
std::vector<float> run(const nlohmann::json& description, const std::vector<Shape>& shapes, DType activations,
                       bool fusion, const std::vector<std::string>& expect_fused = {}) {
  auto& context = test::context();
  const char* names[] = {"input", "skip"};
  std::vector<GraphInput> graph_inputs;
  for (size_t i = 0; i < shapes.size(); ++i) graph_inputs.push_back({names[i], shapes[i], activations});
  Network network(description, graph_inputs, false);
  network.set_fusion(fusion);
  network.set_activation_dtype(activations);
  for (size_t l = 0; l < network.layers().size(); ++l) {
    bool expected = std::find(expect_fused.begin(), expect_fused.end(), network.layers()[l].name) != expect_fused.end();
    EXPECT_EQ(network.fused_away(l, false), fusion && expected) << network.layers()[l].name;
  }
  network.allocate(context);
  network.initialise(7);
  uint32_t seed = 11;
  for (auto& named : network.named_tensors()) {
    // Variances in [0.5, 1.5]; every other tensor in [-1, 1] (a layer scale's gamma too).
    bool variance = named.name.find("running_var") != std::string::npos;
    named.tensor->upload(test::random_values(static_cast<size_t>(named.tensor->count()), seed++, variance ? 0.5f : -1.0f,
                                             variance ? 1.5f : 1.0f));
  }
  network.prepare(context);
  std::vector<std::unique_ptr<Tensor>> inputs;
  Network::Bound bound;
  for (size_t i = 0; i < shapes.size(); ++i) {
    inputs.push_back(std::make_unique<Tensor>(context, names[i], shapes[i], activations));
    inputs.back()->upload(test::random_values(static_cast<size_t>(element_count(shapes[i])), 3 + i, -2, 2));
    bound[names[i]] = inputs.back().get();
  }
  InferenceProgram(context, network, bound).run();
  return network.output().download();
}

struct Chain {
  const char* what;
  nlohmann::json layers;                  // after the host, which is layer "host"
  std::vector<std::string> fused;         // the layers the host's store computes
  // Also in fp16: a store of each type with a residual read through its type's texels is
  // enough, since the epilogue computes in float either way (a new pipeline costs ~1 s on
  // lavapipe, and CI has no time to spare).
  bool fp16 = true;
};

// One target per kind of GEMM kernel that runs on the device (register blocks, shared-memory
// tiles): the epilogue is one function of the kernel, whatever its tile shapes.
std::vector<vk::TileTarget> one_target_per_kind() {
  std::vector<vk::TileTarget> targets;
  std::vector<GemmKind> kinds;
  for (const vk::TileTarget& target : test::runnable_tile_targets(test::context())) {
    GemmKind kind = gemm_tiles(target, 64).kind;
    if (std::find(kinds.begin(), kinds.end(), kind) != kinds.end()) continue;
    kinds.push_back(kind);
    targets.push_back(target);
  }
  return targets;
}

// Fused against unfused for every chain after one host layer, on each kind of kernel and type;
// `registers_only`: the shape matters to the register kernels alone (four-float texels or not).
void expect_chains_match(const nlohmann::json& host, const Shape& input, const Shape& output,
                         const std::vector<Chain>& chains, double fp32_tolerance, bool registers_only = false) {
  for (const vk::TileTarget& target : one_target_per_kind())
    for (DType activations : {DType::f32, DType::f16}) {
      if (registers_only && gemm_tiles(target, 64).kind != GemmKind::registers) continue;
      test::TileTargetScope scope(test::context(), target);
      for (const Chain& chain : chains) {
        if (activations == DType::f16 && !chain.fp16) continue;
        nlohmann::json layers = nlohmann::json::array({host});
        for (auto& l : chain.layers) layers.push_back(l);
        nlohmann::json description = {{"layers", layers}};
        SCOPED_TRACE(test::describe(target) + (activations == DType::f16 ? " fp16 " : " fp32 ") + chain.what + " " +
                     to_string(input));
        auto fused = run(description, {input, output}, activations, true, chain.fused);
        auto unfused = run(description, {input, output}, activations, false);
        double largest = 0;
        for (size_t i = 0; i < fused.size(); ++i)
          largest = std::max(largest, std::abs(static_cast<double>(fused[i]) - unfused[i]) /
                                          std::max(1.0, std::abs(static_cast<double>(unfused[i]))));
        std::printf("{\"fusion\":\"%s\",\"target\":\"%s\",\"activations\":\"%s\",\"largest_relative_difference\":%.3g}\n",
                    chain.what, test::describe(target).c_str(), activations == DType::f16 ? "fp16" : "fp32", largest);
        // fp16: the unfused graph rounds each intermediate to fp16, the fused store once.
        test::expect_near(fused, unfused, activations == DType::f16 ? test::forward_tolerance(activations) : fp32_tolerance,
                          chain.what);
      }
    }
}

std::vector<Chain> linear_chains() {
  // Every step in its place: the residual after the activation and the scale (a ViT's proj with
  // ls1 and the add, and fc1's GELU), and before them (ResNet's add then ReLU).
  return {
      {"linear+gelu+layer_scale+residual",
       {layer("act", "gelu"), layer("ls", "layer_scale"), layer("sum", "add", {}, {"skip", "ls"})},
       {"act", "ls", "sum"}},
      {"linear+residual+relu+layer_scale",
       {layer("sum", "add", {}, {"host", "skip"}), layer("act", "relu"), layer("ls", "layer_scale")},
       {"sum", "act", "ls"}},
      {"linear+silu", {layer("act", "silu")}, {"act"}, false},
  };
}

// Four-float texels (prepared weight^T, in and out multiples of 4: gemm_quads.comp on CPU
// devices) and float texels (gemm.comp); 2 x 7 tokens, no multiple of a tile's rows or columns.
TEST(Fusion, LinearEpiloguesMatchTheUnfusedPair) {
  expect_chains_match(layer("host", "linear", {{"out_features", 20}}, {"input"}), {2, 7, 36}, {2, 7, 20},
                      linear_chains(), 2e-6, true);
  expect_chains_match(layer("host", "linear", {{"out_features", 19}}, {"input"}), {2, 7, 33}, {2, 7, 19},
                      linear_chains(), 2e-6);
}

// The folded batch norm (the weight scaled in prepare: fp32 rounding of its own, as before this
// vocabulary), then a residual and a ReLU, as ResNet's last convolution of a block.
TEST(Fusion, Conv2dEpiloguesMatchTheUnfusedPair) {
  std::vector<Chain> chains = {
      {"conv2d+batch_norm+residual+relu",
       {layer("bn", "batch_norm2d"), layer("sum", "add", {}, {"bn", "skip"}), layer("act", "relu")},
       {"bn", "sum", "act"}},
      {"conv2d+gelu", {layer("act", "gelu")}, {"act"}, false},
  };
  expect_chains_match(layer("host", "conv2d", {{"out_channels", 5}, {"kernel", 3}, {"padding", 1}}, {"input"}),
                      {2, 3, 9, 7}, {2, 5, 9, 7}, chains, 1e-5);
}

// What cannot fuse does not: an add whose other input is written after the host, a second
// activation, and in training anything but a ReLU.
TEST(Fusion, OnlyWhatKeepsTheOrderAndTheBackwardFuses) {
  nlohmann::json graph = {{"layers",
                           {layer("a", "linear", {{"out_features", 8}}, {"input"}), layer("b", "linear", {{"out_features", 8}}, {"input"}),
                            layer("sum", "add", {}, {"a", "b"}), layer("act", "relu"), layer("again", "relu"),
                            layer("fc", "linear", {{"out_features", 8}}), layer("gelu", "gelu")}}};
  Network network(graph, Shape{3, 8}, false);
  auto fused = [&](const std::string& name, bool training) {
    for (size_t l = 0; l < network.layers().size(); ++l)
      if (network.layers()[l].name == name) return network.fused_away(l, training);
    throw std::logic_error(name);
  };
  // b runs after a: the add joins b's store (a is written first), then the ReLU; a second ReLU
  // would apply after the first, which the store has taken.
  EXPECT_FALSE(fused("a", false));
  EXPECT_TRUE(fused("sum", false));
  EXPECT_TRUE(fused("act", false));
  EXPECT_FALSE(fused("again", false));
  EXPECT_TRUE(fused("gelu", false));
  nlohmann::json trained = {{"layers",
                             {layer("a", "linear", {{"out_features", 8}}, {"input"}), layer("b", "linear", {{"out_features", 8}}, {"input"}),
                              layer("sum", "add", {}, {"a", "b"}), layer("act", "relu")}}};
  Network training(trained, Shape{3, 8}, true);
  EXPECT_FALSE(training.fused_away(2, true));  // the add: inference only
  EXPECT_TRUE(training.fused_away(3, true));   // the ReLU, in the add's own store
}

// A ViT block (timm's, with LayerScale as UNI's) runs in 7 passes instead of 12: qkv, fc1 with
// its GELU, proj and fc2 each with its layer scale and residual add, one dispatch each (a
// prepared linear records one); the features within fp32 rounding of the unfused graph.
TEST(Fusion, AViTBlockRunsEachLinearWithItsEpilogueInOneDispatch) {
  nlohmann::json vit = {{"family", "vit"}, {"image_size", 16}, {"patch_size", 8}, {"width", 24}, {"depth", 2},
                        {"heads", 2},      {"layer_scale", 1e-5}};
  const Shape shape{2, 3, 16, 16};
  std::vector<std::string> fused_away;
  for (std::string block : {"blocks.0.", "blocks.1."})
    for (std::string name : {"mlp.act", "ls1", "residual1", "ls2", "residual2"}) fused_away.push_back(block + name);
  Network network(vit, shape, false);
  size_t passes = 0;
  for (size_t l = 0; l < network.layers().size(); ++l)
    if (network.layers()[l].name.rfind("blocks.0.", 0) == 0 && !network.fused_away(l, false)) ++passes;
  EXPECT_EQ(passes, 7u);  // norm1, qkv, attend, proj, norm2, fc1, fc2
  auto fused = run(vit, {shape}, DType::f32, true, fused_away);
  auto unfused = run(vit, {shape}, DType::f32, false);
  double largest = 0;
  for (size_t i = 0; i < fused.size(); ++i) largest = std::max(largest, std::abs(static_cast<double>(fused[i]) - unfused[i]));
  std::printf("{\"fusion\":\"vit features\",\"largest_absolute_difference\":%.3g}\n", largest);
  test::expect_near(fused, unfused, 1e-5, "ViT features");
}

}  // namespace
}  // namespace tessera
