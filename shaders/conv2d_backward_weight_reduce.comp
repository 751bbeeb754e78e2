#version 450
// dweight[i] += sum_z partial[z, i]: the split-K slices of conv2d_backward_weight, summed in a
// fixed order so that results do not depend on scheduling.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer Partial { float partial[]; };
layout(std430, binding = 1) buffer Grad { float grad[]; };
layout(push_constant) uniform Push { uint count, slices; } p;
void main() {
  uint i = global_index();
  if (i >= p.count) return;
  float sum = 0.0;
  for (uint z = 0; z < p.slices; ++z) sum += partial[z * p.count + i];
  grad[i] += sum;
}
