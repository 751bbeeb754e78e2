#version 450
// The start of moore_penrose_iter_pinv (nystrom_attention.py): z0 = x^T / (max row sum *
// max column sum) of |x|, the maxima over every head, for x [heads, m, m]. One workgroup.
// scales = [largest row sum, largest column sum, the (head * m + column) that holds it].
#include "common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Z { float z[]; };
layout(std430, binding = 2) writeonly buffer Scales { float scales[]; };
layout(push_constant) uniform Push {
  uint heads, side;
} p;

shared float largest[256];
shared uint holder[256];

// The workgroup's largest value, and the lowest index that holds it (torch.max's choice is
// immaterial here: only a tie would make it matter).
void workgroup_max(inout float value, inout uint index) {
  uint t = gl_LocalInvocationID.x;
  largest[t] = value;
  holder[t] = index;
  barrier();
  for (uint half_size = 128u; half_size > 0u; half_size >>= 1) {
    if (t < half_size) {
      float other = largest[t + half_size];
      uint other_index = holder[t + half_size];
      if (other > largest[t] || (other == largest[t] && other_index < holder[t])) {
        largest[t] = other;
        holder[t] = other_index;
      }
    }
    barrier();
  }
  value = largest[0];
  index = holder[0];
  barrier();
}

void main() {
  uint t = gl_LocalInvocationID.x, side = p.side, lines = p.heads * side;
  float row_max = 0.0, column_max = 0.0;
  uint row_at = 0xffffffffu, column_at = 0xffffffffu;
  for (uint line = t; line < lines; line += 256u) {
    uint head = line / side, i = line % side, first = head * side * side;
    float row = 0.0, column = 0.0;
    for (uint j = 0u; j < side; ++j) {
      row += abs(x[first + i * side + j]);
      column += abs(x[first + j * side + i]);
    }
    if (row > row_max || row_at == 0xffffffffu) { row_max = row; row_at = line; }
    if (column > column_max || column_at == 0xffffffffu) { column_max = column; column_at = line; }
  }
  workgroup_max(row_max, row_at);
  workgroup_max(column_max, column_at);
  float scale = 1.0 / (row_max * column_max);
  uint size = lines * side;
  for (uint e = t; e < size; e += 256u) {
    uint head = e / (side * side), i = e / side % side, j = e % side;
    z[e] = x[(head * side + j) * side + i] * scale;
  }
  if (t == 0u) {
    scales[0] = row_max;
    scales[1] = column_max;
    scales[2] = float(column_at);
  }
}
