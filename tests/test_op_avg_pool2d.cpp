// Average pooling (padding counted as zeros, as PyTorch's default) against the CPU and
// central differences.
#include <gtest/gtest.h>

#include "compute/ops/avg_pool2d.h"
#include "tests/support/op_check.h"
#include "tests/support/vulkan_environment.h"

namespace tessera {
namespace {

struct Geometry {
  int64_t kernel_size, stride, padding;
};

std::unique_ptr<Op> make(const Geometry& g) {
  return make_avg_pool2d(LayerConfig(
      {{"name", "pool"}, {"type", "avg_pool2d"}, {"kernel_size", g.kernel_size}, {"stride", g.stride}, {"padding", g.padding}}));
}

// x [N,C,H,W] -> y [N,C,OH,OW]; every window divides by kernel_size^2
std::vector<float> avg_pool_cpu(const std::vector<float>& x, const Shape& in, const Shape& out, const Geometry& g) {
  std::vector<float> y(static_cast<size_t>(element_count(out)));
  for (int64_t plane = 0; plane < in[0] * in[1]; ++plane)
    for (int64_t oy = 0; oy < out[2]; ++oy)
      for (int64_t ox = 0; ox < out[3]; ++ox) {
        double sum = 0;
        for (int64_t ky = 0; ky < g.kernel_size; ++ky)
          for (int64_t kx = 0; kx < g.kernel_size; ++kx) {
            int64_t iy = oy * g.stride - g.padding + ky, ix = ox * g.stride - g.padding + kx;
            if (iy >= 0 && iy < in[2] && ix >= 0 && ix < in[3])
              sum += x[static_cast<size_t>((plane * in[2] + iy) * in[3] + ix)];
          }
        y[static_cast<size_t>((plane * out[2] + oy) * out[3] + ox)] =
            static_cast<float>(sum / static_cast<double>(g.kernel_size * g.kernel_size));
      }
  return y;
}

const Geometry kGeometries[] = {{2, 2, 0}, {3, 2, 1}, {3, 1, 1}, {2, 1, 1}, {3, 3, 0}};

TEST(AvgPool2d, ForwardMatchesCpu) {
  uint32_t seed = 1;
  for (const Geometry& g : kGeometries) {
    auto op = make(g);
    Shape in{2, 3, 9, 7};
    test::OpCheck check(test::context(), *op, {in}, seed++);
    test::expect_near(check.forward(), avg_pool_cpu(check.inputs[0], in, check.output_shape, g), 1e-6,
                      "avg_pool2d");
  }
}

TEST(AvgPool2d, BackwardMatchesFiniteDifferences) {
  uint32_t seed = 10;
  for (const Geometry& g : kGeometries) {
    // As for max pooling: 6x12 is tiled exactly by the 2x2/2 and 3x3/3 windows.
    for (const Shape& in : {Shape{2, 2, 7, 9}, Shape{2, 2, 6, 12}}) {
      auto op = make(g);
      test::OpCheck check(test::context(), *op, {in}, seed++);
      check.expect_gradients_match(1e-2, 1e-3, 48);
    }
  }
}

}  // namespace
}  // namespace tessera
