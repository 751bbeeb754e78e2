// tanh against the CPU (fp32 and fp16, sizes that are not a workgroup's multiple, large inputs
// that saturate) and its backward against central differences.
#include <gtest/gtest.h>

#include <cmath>

#include "compute/ops/tanh.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

TEST(Tanh, ForwardAndBackwardMatchCpu) {
  for (DType activations : {DType::f32, DType::f16})
    for (int64_t count : {1, 7, 1000, 1001}) {
      SCOPED_TRACE(std::to_string(count) + (activations == DType::f16 ? " fp16" : " fp32"));
      Tanh op;
      test::OpCheck check(test::context(), op, {{count, 1}}, 4, {DType::f32}, {}, activations);
      auto& x = check.inputs[0];
      for (size_t i = 0; i < x.size(); ++i) x[i] *= i % 3 == 0 ? 60.0f : 3.0f;  // past tanh's saturation too
      if (activations == DType::f16) x = from_half(to_half(x));
      std::vector<float> y(x.size());
      for (size_t i = 0; i < x.size(); ++i) y[i] = std::tanh(x[i]);
      test::expect_near(check.forward(), y, test::forward_tolerance(activations), "y");
      auto dy = test::random_values(x.size(), 5);
      if (activations == DType::f16) dy = from_half(to_half(dy));
      std::vector<float> dx(x.size());
      // From the output as stored: fp16 rounds y before the backward reads it.
      for (size_t i = 0; i < x.size(); ++i) {
        float stored = activations == DType::f16 ? from_half(to_half(std::vector<float>{y[i]}))[0] : y[i];
        dx[i] = dy[i] * (1 - stored * stored);
      }
      test::expect_near(check.backward(dy)[0], dx, test::forward_tolerance(activations), "dx");
    }
}

TEST(Tanh, BackwardMatchesFiniteDifferences) {
  Tanh op;
  test::OpCheck check(test::context(), op, {{5, 7}}, 2);
  check.expect_gradients_match();
}

}  // namespace
}  // namespace tessera
