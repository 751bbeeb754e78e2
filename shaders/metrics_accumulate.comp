#version 450
// Adds a batch's cross-entropy and correct predictions to running sums, on the device, so the
// host reads them only when it reports: metrics[0] += sum of -log softmax(logits)[label],
// metrics[1] += correct, metrics[2] += samples. Only the first valid[0] samples count.
#include "common.glsl"
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Logits { ACT logits[]; };  // [N,C]
layout(std430, binding = 1) readonly buffer Labels { uint labels[]; };   // [N]
layout(std430, binding = 2) readonly buffer Valid { uint valid[]; };     // [1]
layout(std430, binding = 3) buffer Metrics { float metrics[]; };         // [4]
layout(push_constant) uniform Push { uint classes; } p;
shared float loss_sum[64];
shared float correct_sum[64];
void main() {
  uint t = gl_LocalInvocationID.x;
  float loss = 0.0, correct = 0.0;
  for (uint n = t; n < valid[0]; n += 64u) {
    uint row = n * p.classes;
    float largest = float(logits[row]);
    uint best = 0u;
    for (uint c = 1u; c < p.classes; ++c)
      if (float(logits[row + c]) > largest) { largest = float(logits[row + c]); best = c; }
    float total = 0.0;
    for (uint c = 0u; c < p.classes; ++c) total += exp(float(logits[row + c]) - largest);
    loss += log(total) + largest - float(logits[row + labels[n]]);
    correct += best == labels[n] ? 1.0 : 0.0;
  }
  loss_sum[t] = loss;
  correct_sum[t] = correct;
  barrier();
  for (uint stride = 32u; stride > 0u; stride >>= 1) {
    if (t < stride) {
      loss_sum[t] += loss_sum[t + stride];
      correct_sum[t] += correct_sum[t + stride];
    }
    barrier();
  }
  if (t == 0u) {
    metrics[0] += loss_sum[0];
    metrics[1] += correct_sum[0];
    metrics[2] += float(valid[0]);
  }
}
