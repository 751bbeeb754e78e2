// Adds a batch's cross-entropy and correct predictions to running sums, on the device, so the
// host reads them only when it reports: metrics[0] += sum of -log softmax(logits)[label],
// metrics[1] += correct, metrics[2] += samples. Only the first valid[0] samples count.
#include "common.glsl"
layout(local_size_x = 64) in;
#include "reduce.glsl"
layout(std430, binding = 0) readonly buffer Logits { ACT logits[]; };  // [N,C]
layout(std430, binding = 1) readonly buffer Labels { uint labels[]; };   // [N]
layout(std430, binding = 2) readonly buffer Valid { uint valid[]; };     // [1]
layout(std430, binding = 3) buffer Metrics { float metrics[]; };         // [4]
layout(push_constant) uniform Push { uint classes; } p;
void main() {
  uint t = gl_LocalInvocationID.x;
  float loss = 0.0, correct = 0.0;
  for (uint n = t; n < valid[0]; n += gl_WorkGroupSize.x) {
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
  vec2 sums = workgroup_sum(vec2(loss, correct));
  if (t == 0u) {
    metrics[0] += sums.x;
    metrics[1] += sums.y;
    metrics[2] += float(valid[0]);
  }
}
