#version 450
// A learned position table [prefix + gh0*gw0, D] for an input whose patch grid is gh x gw
// instead: the rows of prefix tokens copied, the grid resampled as F.interpolate(mode='bicubic',
// align_corners=False, size=(gh, gw)) does, separably. timm's resample_abs_pos_embed
// (antialias=True): PIL's bicubic filter (a = -0.5), widened by the scale where it shrinks, its
// taps cut at the edges and renormalised. Plain bicubic (Hugging Face's Dinov2, antialias=False):
// four taps around scale * (o + 0.5) - 0.5 with a = -0.75, indices clamped to the edges; by scale
// factor (DINO's and iBOT's interpolate_pos_encoding, CONCH v1.5's trunk: F.interpolate(scale_factor=
// (new + 0.1) / old)), the same with PyTorch's scale taken as old / (new + 0.1), not old / new.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(binding = 0) uniform samplerBuffer table;
layout(std430, binding = 1) writeonly buffer Resampled { float resampled[]; };
layout(push_constant) uniform Push {
  uint count;  // (prefix + gh * gw) * D
  uint width, prefix;
  uint old_height, old_width, new_height, new_width;
  uint mode;  // 0 timm's antialiased, 1 plain bicubic to the size, 2 plain bicubic by scale factor
} p;

float cubic(float x) {
  const float a = p.mode != 0u ? -0.75 : -0.5;
  x = abs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

// The input taps [first, first + taps) of output index `o` and what the filter is evaluated at.
struct Window {
  int first, taps;
  float center, inverse_scale;
};
Window window(uint o, uint input_size, uint output_size) {
  float scale = float(input_size) / (float(output_size) + (p.mode == 2u ? 0.1 : 0.0));
  if (p.mode != 0u) {  // taps floor(source) - 1 .. + 2, each at its own distance
    float source = scale * (float(o) + 0.5) - 0.5;
    Window w;
    w.first = int(floor(source)) - 1;
    w.taps = 4;
    w.center = source + 0.5;  // weight() subtracts 0.5 back
    w.inverse_scale = 1.0;
    return w;
  }
  float support = scale >= 1.0 ? 2.0 * scale : 2.0;
  Window w;
  w.center = scale * (float(o) + 0.5);
  w.inverse_scale = scale >= 1.0 ? 1.0 / scale : 1.0;
  w.first = max(int(w.center - support + 0.5), 0);  // int() truncates toward zero, as PyTorch's cast
  w.taps = min(int(w.center + support + 0.5), int(input_size)) - w.first;
  return w;
}
float weight(Window w, int tap) { return cubic((float(w.first + tap) - w.center + 0.5) * w.inverse_scale); }
float total(Window w) {
  if (p.mode != 0u) return 1.0;  // the four weights sum to one
  float sum = 0.0;
  for (int tap = 0; tap < w.taps; ++tap) sum += weight(w, tap);
  return sum;
}

void main() {
  uint i = global_index();
  if (i >= p.count) return;
  uint d = i % p.width, row = i / p.width;
  if (row < p.prefix) {
    resampled[i] = texelFetch(table, int(i)).x;
    return;
  }
  uint cell = row - p.prefix, oy = cell / p.new_width, ox = cell % p.new_width;
  Window wy = window(oy, p.old_height, p.new_height), wx = window(ox, p.old_width, p.new_width);
  float sum = 0.0;
  for (int ty = 0; ty < wy.taps; ++ty) {
    float across = 0.0;
    for (int tx = 0; tx < wx.taps; ++tx) {
      uint y = uint(clamp(wy.first + ty, 0, int(p.old_height) - 1)), x = uint(clamp(wx.first + tx, 0, int(p.old_width) - 1));
      uint source = p.prefix + y * p.old_width + x;
      across += weight(wx, tx) * texelFetch(table, int(source * p.width + d)).x;
    }
    sum += weight(wy, ty) * across;
  }
  resampled[i] = sum / (total(wy) * total(wx));
}
