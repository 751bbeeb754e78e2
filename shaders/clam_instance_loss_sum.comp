#version 450
// loss = the sum of row_losses in slot order (one invocation: the same bag, the same bits);
// NaN for a label outside [0, C)
layout(local_size_x = 1) in;
layout(std430, binding = 0) readonly buffer RowLosses { float row_losses[]; };
layout(std430, binding = 1) readonly buffer Labels { uint label; };
layout(std430, binding = 2) writeonly buffer Loss { float loss; };
#include "clam_instance_loss.glsl"
void main() {
  float sum = 0.0;
  for (uint s = 0u; s < p.classes * 2u * p.k_sample; ++s) sum += row_losses[s];
  loss = label < p.classes ? sum : uintBitsToFloat(0x7fc00000u);
}
