// Every op in mixed precision (fp16 activations and activation gradients, fp32 parameters and
// sums) against the same op in fp32 on the same values: forward and backward. The fp32 run is
// the reference: each op's own test holds it to a plain CPU loop within 1e-4, an order below
// the fp16 tolerance here.
//
// The measure is scale-free: the largest error against the largest reference value,
// max |fp16 - fp32| <= kTolerance * max |fp32|. The inputs and the upstream gradient are fp16
// values in both runs, so what differs is one rounding of each stored fp16 value (at most
// 2^-11 relative, fp16's unit roundoff u), plus the float sums' own error (reductions here are
// at most a few hundred long: K * 2^-24 < 0.02 u). kTolerance = 4u leaves room for an op that
// stores one fp16 intermediate on the way and for the reference's own 1e-4.
#include <gtest/gtest.h>

#include <ostream>

#include "compute/ops/registry.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

constexpr double kUnitRoundoff = 1.0 / 2048;  // 2^-11
constexpr double kTolerance = 4 * kUnitRoundoff;

struct Case {
  nlohmann::json layer;  // {"type": ..., fields}
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;  // f32 (float, an activation) where shorter
  // Whole-number inputs (labels, a bag's count) the case sets: input index -> values.
  std::map<size_t, std::vector<float>> set = {};
};

// What ctest and gtest print for a case: its layer, not the struct's bytes.
void PrintTo(const Case& c, std::ostream* out) { *out << c.layer.dump(); }

std::unique_ptr<Op> make(const Case& c) {
  nlohmann::json layer = c.layer;
  layer["name"] = "op";
  return make_op(LayerConfig(layer));
}

void expect_close(const std::vector<float>& half, const std::vector<float>& full, const std::string& what) {
  double largest = test::expect_relative(half, full, kTolerance, what + ": fp16 against fp32");
  EXPECT_GT(largest, 0) << what << " is all zeros: the comparison would prove nothing";
}

class Fp16Op : public ::testing::TestWithParam<Case> {};

TEST_P(Fp16Op, ForwardAndBackwardMatchFp32) {
  const Case& c = GetParam();
  auto op16 = make(c), op32 = make(c);
  test::OpCheck half(test::context(), *op16, c.shapes, 5, c.dtypes, {}, DType::f16);
  test::OpCheck full(test::context(), *op32, c.shapes, 5, c.dtypes, {}, DType::f32);
  for (auto& [input, values] : c.set) half.inputs[input] = values;
  full.inputs = half.inputs;  // rounded to fp16 values
  ASSERT_EQ(full.tensors, half.tensors);
  for (size_t s = 0; s < half.specs.size(); ++s)
    if (half.specs[s].name == "class_weight")  // as the loss starts in training: every class weighs 1
      full.tensors[s] = half.tensors[s] = std::vector<float>(half.tensors[s].size(), 1.0f);
  std::string type = c.layer["type"];
  expect_close(half.forward(), full.forward(), type + " forward");

  auto dy = test::random_values(static_cast<size_t>(element_count(half.output_shape)), 9);
  dy = from_half(to_half(dy));
  auto grads16 = half.backward(dy), grads32 = full.backward(dy);
  ASSERT_EQ(grads16.size(), grads32.size());
  for (size_t g = 0; g < grads16.size(); ++g)
    if (!grads32[g].empty()) expect_close(grads16[g], grads32[g], type + " backward, gradient " + std::to_string(g));
}

const Case kCases[] = {
    {{{"type", "conv2d"}, {"out_channels", 6}, {"kernel", 3}, {"padding", 1}}, {{2, 5, 9, 7}}},
    {{{"type", "conv2d"}, {"out_channels", 4}, {"kernel", 7}, {"stride", 2}, {"padding", 3}, {"bias", false}},
     {{2, 3, 13, 11}}},
    {{{"type", "linear"}, {"out_features", 9}}, {{6, 23}}},
    {{{"type", "batch_norm2d"}}, {{4, 3, 5, 6}}},
    {{{"type", "batch_norm2d"}}, {{7, 5}}},
    {{{"type", "relu"}}, {{3, 4, 5, 7}}},  // 420: a whole number of groups of four
    {{{"type", "relu"}}, {{3, 37}}},       // 111: and a partial last group
    {{{"type", "add"}}, {{2, 3, 5, 7}, {2, 3, 5, 7}}},
    {{{"type", "max_pool2d"}, {"kernel_size", 2}}, {{2, 3, 8, 6}}},
    {{{"type", "max_pool2d"}, {"kernel_size", 3}, {"stride", 2}, {"padding", 1}}, {{2, 3, 9, 9}}},
    {{{"type", "avg_pool2d"}, {"kernel_size", 2}}, {{2, 3, 8, 6}}},
    {{{"type", "avg_pool2d"}, {"kernel_size", 3}, {"stride", 2}, {"padding", 1}}, {{2, 3, 9, 9}}},
    {{{"type", "global_avg_pool"}}, {{3, 5, 6, 7}}},
    {{{"type", "flatten"}}, {{3, 4, 5, 2}}},
    {{{"type", "dropout"}, {"p", 0.3}}, {{4, 3, 6, 5}}},
    {{{"type", "softmax_cross_entropy"}}, {{13, 5}, {13}}, {DType::f32, DType::u32},
     {{1, {0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2}}}},
    {{{"type", "attention_gate"}}, {{17, 11}, {17, 11}}},
    {{{"type", "attention_pool"}}, {{9, 1}, {9, 6}, {1}}, {DType::f32, DType::f32, DType::u32}, {{2, {7}}}},
    {{{"type", "attention_pool"}}, {{9, 3}, {9, 6}, {1}}, {DType::f32, DType::f32, DType::u32}, {{2, {7}}}},
    {{{"type", "tanh"}}, {{5, 13}}},
    {{{"type", "instance_mean"}}, {{9, 6}, {1}}, {DType::f32, DType::u32}, {{1, {7}}}},
    {{{"type", "layer_norm"}}, {{2, 5, 37}}},
    // TransMIL: a bag of 7 in a sequence sized for 12 (side 3 of 4), its attention and its class token's output
    {{{"type", "transmil_sequence"}}, {{12, 6}, {1}}, {DType::f32, DType::u32}, {{1, {7}}}},
    {{{"type", "ppeg"}}, {{1, 17, 6}, {1}}, {DType::f32, DType::u32}, {{1, {7}}}},
    {{{"type", "nystrom_attention"}, {"heads", 2}, {"landmarks", 4}}, {{1, 17, 8}, {1}}, {DType::f32, DType::u32}, {{1, {7}}}},
    // Heads of 8 columns and 20 rows: its products read and write four-element texels on lavapipe
    {{{"type", "nystrom_attention"}, {"heads", 2}, {"landmarks", 4}}, {{1, 20, 16}, {1}}, {DType::f32, DType::u32}, {{1, {13}}}},
    {{{"type", "token_pool"}}, {{2, 6, 7}}},
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return info.param.layer["type"].get<std::string>() + "_" + std::to_string(info.index);
}

INSTANTIATE_TEST_SUITE_P(EveryOp, Fp16Op, ::testing::ValuesIn(kCases), case_name);

// input_normalize (uint8 images in, no gradient) is held to PyTorch in fp16 by
// test_resnet50_torch.py, which feeds tiles through it; critical_instance_scores (whose logits
// input gets a gradient of zeros, which this measure cannot hold) to a CPU loop in fp16 by its own
// test.

}  // namespace
}  // namespace tessera
