// The epilogue of the GEMM-like kernels (compute/op.h's Epilogue): what their store applies to
// an output y = sum + bias (and a folded batch norm's shift, which the kernel adds itself), in
// this order: the residual where RESIDUAL is 1 (ResNet: bn, add, relu), the activation, the scale
// (timm's LayerScale), the residual where RESIDUAL is 2 (a ViT: proj, ls1, add).
//
// The including shader defines EPILOGUE_CONSTANT (the first of its three specialization
// constants) and EPILOGUE_BINDING (the first of its two bindings) before including this file,
// after common.glsl. Both tensors are read as storage texels (common.glsl says why): the
// residual is an activation of the output's type, the scale a float parameter.
#ifndef TESSERA_EPILOGUE_GLSL
#define TESSERA_EPILOGUE_GLSL
#include "activations.glsl"

layout(constant_id = EPILOGUE_CONSTANT) const int ACTIVATION = 0;  // 0 none, 1 ReLU, 2 GELU, 3 SiLU
layout(constant_id = EPILOGUE_CONSTANT + 1) const bool HAS_SCALE = false;
layout(constant_id = EPILOGUE_CONSTANT + 2) const int RESIDUAL = 0;  // 0 none, 1 before the activation, 2 after
layout(binding = EPILOGUE_BINDING, r32f) uniform readonly imageBuffer epilogue_scale;  // [features]; unread without HAS_SCALE
layout(binding = EPILOGUE_BINDING + 1, ACT_TEXELS) uniform readonly imageBuffer epilogue_residual;  // like the output; unread without RESIDUAL

// y for output element `at` (its index in the output) of feature `feature`; only for elements
// inside the output.
float epilogue(float y, uint feature, uint at) {
  if (RESIDUAL == 1) y += imageLoad(epilogue_residual, int(at)).x;
  if (ACTIVATION == 1) y = relu(y);
  if (ACTIVATION == 2) y = gelu(y);
  if (ACTIVATION == 3) y = silu(y);
  if (HAS_SCALE) y *= imageLoad(epilogue_scale, int(feature)).x;
  if (RESIDUAL == 2) y += imageLoad(epilogue_residual, int(at)).x;
  return y;
}

#endif
