#version 450
// dloss[n] = weight * scale for each of the batch's samples: the loss gradient that backward
// starts from, multiplied by the dynamic loss scale (state[0], see loss_scale_update.comp) so
// that small fp16 gradients do not flush to zero; weight is 1/K for K accumulated micro-batches.
// With per_sample, each sample keeps the weight already in dloss (a data-parallel replica's
// share of the batch, staged by the host) and only the scale is applied.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer State { float state[]; };
layout(std430, binding = 1) buffer DLoss { float dloss[]; };
layout(push_constant) uniform Push { uint count; float weight; uint per_sample; } p;
void main() {
  uint i = global_index();
  if (i < p.count) dloss[i] = (p.per_sample != 0u ? dloss[i] : p.weight) * state[0];
}
