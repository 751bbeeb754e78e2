// The epilogue of the GEMM-like kernels (compute/op.h's Epilogue): what their store applies to
// an output y = sum + bias (and a folded batch norm's shift, which the kernel adds itself), in
// this order: the residual where RESIDUAL is 1 (ResNet: bn, add, relu), the activation, the scale
// (timm's LayerScale), the residual where RESIDUAL is 2 (a ViT: proj, ls1, add).
//
// The including shader defines EPILOGUE_CONSTANT (the first of its three specialization
// constants) and EPILOGUE_BINDING (the first of its two bindings) before including this file,
// after common.glsl. Both are storage buffers, read once an output: the residual an activation
// of the output's type, the scale a float parameter. As texels they would add sampled views or
// images that the kernel may leave unread, and llvmpipe keys an unread image below a read one on
// stale bytes (common.glsl).
#ifndef TESSERA_EPILOGUE_GLSL
#define TESSERA_EPILOGUE_GLSL
#include "activations.glsl"

layout(constant_id = EPILOGUE_CONSTANT) const int ACTIVATION = 0;  // 0 none, 1 ReLU, 2 GELU, 3 SiLU
layout(constant_id = EPILOGUE_CONSTANT + 1) const bool HAS_SCALE = false;
layout(constant_id = EPILOGUE_CONSTANT + 2) const int RESIDUAL = 0;  // 0 none, 1 before the activation, 2 after
layout(std430, binding = EPILOGUE_BINDING) readonly buffer EpilogueScale { float epilogue_scale[]; };  // [features]; unread without HAS_SCALE
layout(std430, binding = EPILOGUE_BINDING + 1) readonly buffer EpilogueResidual { ACT epilogue_residual[]; };  // like the output; unread without RESIDUAL

// y for output element `at` (its index in the output) of feature `feature`; only for elements
// inside the output.
float epilogue(float y, uint feature, uint at) {
  if (RESIDUAL == 1) y += float(epilogue_residual[at]);
  if (ACTIVATION == 1) y = relu(y);
  if (ACTIVATION == 2) y = gelu(y);
  if (ACTIVATION == 3) y = silu(y);
  if (HAS_SCALE) y *= epilogue_scale[feature];
  if (RESIDUAL == 2) y += float(epilogue_residual[at]);
  return y;
}

#endif
