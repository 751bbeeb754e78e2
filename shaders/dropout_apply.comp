#version 450
// out (+)= keep ? in * scale : 0, with keep = uniform_random(seed, step, first_index + i) >= p.
// Forward passes x -> y, backward dy -> dx: the same mask, recomputed.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer Step { uint step[]; };
layout(std430, binding = 1) readonly buffer In { ACT source[]; };
layout(std430, binding = 2) buffer Out { ACT destination[]; };
layout(push_constant) uniform Push {
  uint count;
  uint first_index;  // sample_offset * elements per sample: the micro-batch's place in the batch
  uint seed;
  float probability, scale;
  uint accumulate;
} p;
void main() {
  uint i = global_index();
  if (i >= p.count) return;
  bool keep = uniform_random(p.seed, step[0], p.first_index + i) >= p.probability;
  float v = keep ? float(source[i]) * p.scale : 0.0;
  destination[i] = ACT(p.accumulate != 0u ? float(destination[i]) + v : v);
}
