// Shared by the softmax cross-entropy kernels, which run one invocation per sample.
#ifndef TESSERA_SOFTMAX_CROSS_ENTROPY_GLSL
#define TESSERA_SOFTMAX_CROSS_ENTROPY_GLSL

layout(std430, binding = 0) readonly buffer Logits { ACT logits[]; };
layout(std430, binding = 1) readonly buffer Labels { uint labels[]; };
layout(std430, binding = 2) readonly buffer ClassWeight { float class_weight[]; };
layout(push_constant) uniform Push { uint samples, classes, accumulate; } p;

float not_a_number() { return uintBitsToFloat(0x7fc00000u); }

// w[y[n]], or NaN for a label that names no class.
float sample_weight(uint n) {
  uint label = labels[n];
  return label < p.classes ? class_weight[label] : not_a_number();
}

// The normaliser of the weighted mean: sum over the batch of w[y[m]].
float weight_total() {
  float total = 0.0;
  for (uint m = 0; m < p.samples; ++m) total += sample_weight(m);
  return total;
}

// log(sum_c exp(logits[n, c])), shifted by the row's maximum so that exp cannot overflow.
float log_sum_exp(uint n) {
  uint row = n * p.classes;
  float largest = float(logits[row]);
  for (uint c = 1; c < p.classes; ++c) largest = max(largest, float(logits[row + c]));
  float sum = 0.0;
  for (uint c = 0; c < p.classes; ++c) sum += exp(float(logits[row + c]) - largest);
  return largest + log(sum);
}

#endif
