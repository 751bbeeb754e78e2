// The graph executor's memory: in inference a buffer is handed on once its last consumer has
// run, so resnet18's forward plans a few activations instead of all of them, computes the
// same outputs as with every activation alive, and allocates exactly what it planned; training
// shares the activations' gradients by their lifetimes in backward.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>

#include "compute/network.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

nlohmann::json resnet18() { return load_model_description("resnet18", 2); }

// The network's output for `x` after initialisation from seed 5, in evaluation mode.
std::vector<float> forward(Network& network, const Shape& shape, const std::vector<float>& x) {
  auto& context = test::context();
  network.allocate(context);
  network.initialise(5);
  Tensor input(context, "input", shape);
  input.upload(x);
  InferenceProgram(context, network, {{"input", &input}}).run();
  return network.output().download();
}

TEST(Graph, InferencePlansAFewActivationsNotAll) {
  const Shape shape{64, 3, 224, 224};
  auto& allocator = test::context().allocator();
  // At most this many times the largest activation (64x64x112x112 floats: conv1's output, and
  // in resnet50 layer1's too) is planned for all activations together.
  const std::pair<const char*, uint64_t> models[] = {{"resnet18", 3}, {"resnet50", 4}};
  for (auto [model, most_alive] : models) {
    auto description = load_model_description(model, 2);
    // Training keeps every activation for backward: what inference planned before reuse.
    MemoryPlan all_alive = Network(description, shape, true).plan(allocator);
    MemoryPlan reused = Network(description, shape, false).plan(allocator);
    uint64_t all_alive_total = all_alive.bytes["activations"] + all_alive.bytes["parameters"];
    std::printf("{\"model\":\"%s\",\"batch\":64,\"size\":224,\"activation_bytes_all_alive\":%llu,"
                "\"activation_bytes_reused\":%llu,\"inference_bytes_all_alive\":%llu,\"inference_bytes_reused\":%llu}\n",
                model, static_cast<unsigned long long>(all_alive.bytes["activations"]),
                static_cast<unsigned long long>(reused.bytes["activations"]),
                static_cast<unsigned long long>(all_alive_total), static_cast<unsigned long long>(reused.total()));
    EXPECT_LE(reused.bytes["activations"], most_alive * 64 * 64 * 112 * 112 * 4) << model;
    // Issue 11: extraction plans at most a third of its memory with every activation alive.
    EXPECT_LE(reused.total() * 3, all_alive_total) << model;
  }
}

// Issue 11: in mixed precision resnet18's training at batch 32 on 224 px plans at most 0.6x
// the fp32 bytes of activations (saved for backward) and their gradients. What stays float:
// the parameters and what ops save beside the activations (conv2d's blocked weight, max
// pooling's argmax, batch norm's statistics).
TEST(Graph, Fp16TrainingPlansAtMostSixTenthsOfTheActivations) {
  const Shape shape{32, 3, 224, 224};
  auto& allocator = test::context().allocator();
  std::map<DType, MemoryPlan> plans;
  for (DType dtype : {DType::f32, DType::f16}) {
    Network network(resnet18(), shape, true);
    network.set_activation_dtype(dtype);
    plans[dtype] = network.plan(allocator);
  }
  auto activations = [&](DType dtype) {
    return plans[dtype].bytes["activations"] + plans[dtype].bytes["activation gradients"];
  };
  std::printf("{\"model\":\"resnet18\",\"batch\":32,\"size\":224,\"training_activation_bytes_fp32\":%llu,"
              "\"training_activation_bytes_fp16\":%llu,\"ratio\":%.3f}\n",
              static_cast<unsigned long long>(activations(DType::f32)),
              static_cast<unsigned long long>(activations(DType::f16)),
              static_cast<double>(activations(DType::f16)) / static_cast<double>(activations(DType::f32)));
  EXPECT_LE(activations(DType::f16) * 10, activations(DType::f32) * 6);
  EXPECT_EQ(plans[DType::f16].bytes["parameters"], plans[DType::f32].bytes["parameters"]);
  EXPECT_EQ(plans[DType::f16].bytes["gradients"], plans[DType::f32].bytes["gradients"]);
}

TEST(Graph, ReusedBuffersGiveTheOutputsOfAllAlive) {
  const Shape shape{2, 3, 64, 64};
  auto x = test::random_values(static_cast<size_t>(element_count(shape)), 3);
  Network all_alive(resnet18(), shape, true), reused(resnet18(), shape, false);
  test::expect_near(forward(reused, shape, x), forward(all_alive, shape, x), 0, "logits with reused buffers");
}

TEST(Graph, InferenceAllocatesWhatItPlanned) {
  const Shape shape{8, 3, 64, 64};
  auto& context = test::context();
  Network network(resnet18(), shape, false);
  uint64_t planned = network.plan(context.allocator()).total();
  uint64_t before = context.allocator().stats().live_bytes;
  network.allocate(context);
  uint64_t allocated = context.allocator().stats().live_bytes - before;
  EXPECT_LE(allocated, planned * 11 / 10);
  EXPECT_GE(allocated * 11 / 10, planned);
}

TEST(Graph, ABranchKeepsItsInputAliveUntilItsLastReader) {
  // x -> a -> b, and add(a, b): a's buffer must not be handed to b.
  nlohmann::json graph = {{"layers",
                           {{{"name", "a"}, {"type", "relu"}},
                            {{"name", "b"}, {"type", "relu"}},
                            {{"name", "c"}, {"type", "relu"}},
                            {{"name", "sum"}, {"type", "add"}, {"inputs", {"a", "c"}}}}}};
  Network network(graph, Shape{4, 8}, false);
  GraphLayout layout = network.layout();
  std::map<std::string, size_t> buffer;
  for (auto& placed : layout.tensors) buffer[placed.name] = placed.buffer;
  EXPECT_NE(buffer["a"], buffer["b"]);
  EXPECT_NE(buffer["a"], buffer["c"]);
  EXPECT_NE(buffer["a"], buffer["sum"]);
  EXPECT_EQ(buffer["b"], buffer["sum"]);  // b's last reader was c
  auto x = test::random_values(32, 4);
  std::vector<float> expected(32);
  for (size_t i = 0; i < 32; ++i) expected[i] = 2 * std::max(0.0f, x[i]);
  test::expect_near(forward(network, {4, 8}, x), expected, 1e-6, "a + relu(relu(a))");
}

TEST(Graph, TrainingSharesActivationGradientsByTheirLifetimesInBackward) {
  // a -> b -> c, sum = a + c, d: in backward d writes sum's gradient, sum a's and c's, c b's.
  auto linear = [](const char* name, std::vector<std::string> inputs) {
    return nlohmann::json{{"name", name}, {"type", "linear"}, {"out_features", 8}, {"inputs", inputs}};
  };
  nlohmann::json graph = {{"layers",
                           {linear("a", {"input"}), linear("b", {"a"}), linear("c", {"b"}),
                            {{"name", "sum"}, {"type", "add"}, {"inputs", {"a", "c"}}}, linear("d", {"sum"})}}};
  GraphLayout layout = Network(graph, Shape{4, 8}, true).layout();
  std::map<std::string, size_t> buffer;
  for (auto& placed : layout.tensors) buffer[placed.name] = placed.buffer;
  EXPECT_EQ(buffer["b.grad"], buffer["sum.grad"]);  // sum's was last read before c's backward wrote b's
  EXPECT_NE(buffer["a.grad"], buffer["sum.grad"]);  // sum's backward writes a's while reading its own
  EXPECT_NE(buffer["c.grad"], buffer["sum.grad"]);
  EXPECT_NE(buffer["a.grad"], buffer["b.grad"]);  // a's lives from sum's backward to its own
  EXPECT_NE(buffer["a.grad"], buffer["c.grad"]);
  EXPECT_NE(buffer["d.grad"], buffer["sum.grad"]);  // the last layer's, seeded by the loss, is its own
  EXPECT_NE(buffer["d.grad"], buffer["a.grad"]);
}

// Training fuses a ReLU into the linear before it: the ReLU's output and gradient are what both
// passes use, and the linear's own are never placed.
TEST(Graph, TrainingPlacesNothingForTheOutputThatAFusedReluReplaces) {
  nlohmann::json graph = {{"layers",
                           {{{"name", "fc"}, {"type", "linear"}, {"out_features", 8}},
                            {{"name", "relu"}, {"type", "relu"}},
                            {{"name", "head"}, {"type", "linear"}, {"out_features", 2}}}}};
  GraphLayout layout = Network(graph, Shape{4, 8}, true).layout();
  std::map<std::string, int> placed;
  for (auto& tensor : layout.tensors) ++placed[tensor.name];
  EXPECT_EQ(placed["fc"], 0);
  EXPECT_EQ(placed["fc.grad"], 0);
  EXPECT_EQ(placed["relu"], 1);
  EXPECT_EQ(placed["relu.grad"], 1);
}

}  // namespace
}  // namespace tessera
