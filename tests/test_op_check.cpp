// The op check itself must fail a wrong backward. The cross-entropy's logit gradients over a
// batch of 64 are about 1/64 each, all under the former absolute floor (tolerance 0.02 times
// max(1, |numeric|)), so a backward that writes zeros passed the former check; the
// scale-free measure (each element against the gradient's rms) fails it.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "compute/ops/softmax_cross_entropy.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

constexpr int64_t kSamples = 64, kClasses = 5;

// The loss with a backward that forgets to write the logits' gradient.
class ZeroBackward : public SoftmaxCrossEntropy {
 public:
  void backward(vk::Recorder& recorder, vk::Kernels&, const OpTensors& t) override {
    recorder.fill(t.input_grads[0]->buffer(), 0);
  }
};

void set_labels(test::OpCheck& check) {
  for (size_t n = 0; n < check.inputs[1].size(); ++n) check.inputs[1][n] = static_cast<float>(n % kClasses);
  check.tensors[0].assign(kClasses, 1.0f);
}

TEST(OpCheck, TheTrueGradientIsUnderTheFormerFloor) {
  SoftmaxCrossEntropy loss;
  test::OpCheck check(test::context(), loss, {{kSamples, kClasses}, {kSamples}}, 2, {DType::f32, DType::u32});
  set_labels(check);
  check.expect_gradients_match(1e-2, 2e-2, 64);
  auto grads = check.backward(test::random_values(kSamples, 2 + 7));
  float largest = 0;
  for (float g : grads[0]) largest = std::max(largest, std::abs(g));
  EXPECT_GT(largest, 0.0f);
  EXPECT_LT(largest, 0.02f);  // so zeros were within tolerance * max(1, |numeric|) of every element
}

TEST(OpCheck, FailsABackwardThatWritesZeros) {
  ZeroBackward loss;
  test::OpCheck check(test::context(), loss, {{kSamples, kClasses}, {kSamples}}, 2, {DType::f32, DType::u32});
  set_labels(check);
  ::testing::TestPartResultArray failures;
  {
    ::testing::ScopedFakeTestPartResultReporter intercept(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
    check.expect_gradients_match(1e-2, 2e-2, 64);
  }
  int gradient_failures = 0;
  for (int i = 0; i < failures.size(); ++i)
    if (std::string(failures.GetTestPartResult(i).message()).find("backward gives 0,") != std::string::npos)
      ++gradient_failures;
  EXPECT_GT(gradient_failures, 0) << "the finite-difference check passed a backward that writes zeros";
}

}  // namespace
}  // namespace tessera
