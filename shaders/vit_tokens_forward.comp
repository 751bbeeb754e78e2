#version 450
// A ViT's token sequence from its patch embedding: the convolution's output x [N, D, P]
// (P = gh * gw patches) becomes tokens [N, prefix + P, D], the class token and the register
// tokens first (timm's order: cls_token, reg_token, patches), and the learned position
// embedding added, over every token (POSITION 1: timm's default, its table holds the prefix
// tokens too), over the patches only (POSITION 2: no_embed_class), or over the class token and
// the patches but not the registers (POSITION 3: Hugging Face's Dinov2WithRegisters, which inserts
// the registers after adding it); POSITION 0: none.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int POSITION = 1;
layout(binding = 0, ACT_TEXELS) uniform readonly imageBuffer x;
layout(binding = 1, r32f) uniform readonly imageBuffer class_token;      // [D]; unread without a class token
layout(binding = 2, r32f) uniform readonly imageBuffer register_tokens;  // [registers, D]; unread without
layout(binding = 3) uniform samplerBuffer position;         // [prefix + P, P or 1 + P, D]; unread without
layout(std430, binding = 4) writeonly buffer Y { ACT y[]; };
layout(push_constant) uniform Push {
  uint count;  // N * (prefix + P) * D
  uint width, patches, has_class, prefix;
} p;
void main() {
  uint i = global_index();
  if (i >= p.count) return;
  uint tokens = p.prefix + p.patches;
  uint d = i % p.width, token = (i / p.width) % tokens, n = i / (p.width * tokens);
  float value;
  if (token < p.has_class)
    value = imageLoad(class_token, int(d)).x;
  else if (token < p.prefix)
    value = imageLoad(register_tokens, int((token - p.has_class) * p.width + d)).x;
  else
    value = imageLoad(x, int((n * p.width + d) * p.patches + token - p.prefix)).x;
  if (POSITION == 1) value += texelFetch(position, int(token * p.width + d)).x;
  if (POSITION == 2 && token >= p.prefix) value += texelFetch(position, int((token - p.prefix) * p.width + d)).x;
  if (POSITION == 3 && (token < p.has_class || token >= p.prefix)) {
    uint row = token < p.has_class ? token : token - p.prefix + p.has_class;
    value += texelFetch(position, int(row * p.width + d)).x;
  }
  y[i] = ACT(value);
}
