// Reductions over the rows of a MIL bag (up to hundreds of thousands of patches) within one
// workgroup of BAG_GROUP invocations, which share the rows: none loops more than rows / 16 times
// (llvmpipe ends all the loops of one invocation after 65,535 iterations together, silently:
// DeviceInfo::kernel_loop_iterations), and the partial results are combined through shared
// memory in a fixed order, so that results repeat bit for bit on a device.
//   Whole workgroup: every invocation strides over the rows of one column (n = t, t + 256, ...)
//     and bag_sum / bag_max give every invocation the workgroup's result.
//   Columns: the workgroup as BAG_LANES neighbouring columns (a lane each, neighbouring loads)
//     by BAG_SLICES slices of the rows (n = slice, slice + 16, ...); bag_slices_sum and
//     bag_slices_argmax give slice 0's invocations their column's result.
// Every invocation must call each function (they hold barriers).
#ifndef TESSERA_BAG_ROWS_GLSL
#define TESSERA_BAG_ROWS_GLSL

layout(local_size_x = 256) in;
const uint BAG_GROUP = 256u, BAG_LANES = 16u, BAG_SLICES = 16u;
const uint NO_ROW = 0xffffffffu;

shared float bag_values[BAG_GROUP];
shared uint bag_rows[BAG_GROUP];

float bag_sum(float value) {
  uint t = gl_LocalInvocationID.x;
  bag_values[t] = value;
  barrier();
  for (uint half_size = BAG_GROUP / 2u; half_size > 0u; half_size >>= 1) {
    if (t < half_size) bag_values[t] += bag_values[t + half_size];
    barrier();
  }
  float total = bag_values[0];
  barrier();  // the scratch may be reused at once
  return total;
}

float bag_max(float value) {
  uint t = gl_LocalInvocationID.x;
  bag_values[t] = value;
  barrier();
  for (uint half_size = BAG_GROUP / 2u; half_size > 0u; half_size >>= 1) {
    if (t < half_size) bag_values[t] = max(bag_values[t], bag_values[t + half_size]);
    barrier();
  }
  float largest = bag_values[0];
  barrier();
  return largest;
}

uint bag_lane() { return gl_LocalInvocationID.x % BAG_LANES; }
uint bag_slice() { return gl_LocalInvocationID.x / BAG_LANES; }

// The slices' partial sums of this lane's column, added in slice order (for slice 0).
float bag_slices_sum(float partial) {
  uint t = gl_LocalInvocationID.x;
  bag_values[t] = partial;
  barrier();
  float total = 0.0;
  if (bag_slice() == 0u)
    for (uint slice = 0u; slice < BAG_SLICES; ++slice) total += bag_values[slice * BAG_LANES + t];
  barrier();
  return total;
}

// The largest value of this lane's column over the slices and its row, the lowest row among
// equal values (a slice that saw no row gives NO_ROW); for slice 0.
void bag_slices_argmax(inout float value, inout uint row) {
  uint t = gl_LocalInvocationID.x;
  bag_values[t] = value;
  bag_rows[t] = row;
  barrier();
  if (bag_slice() == 0u)
    for (uint slice = 1u; slice < BAG_SLICES; ++slice) {
      float candidate = bag_values[slice * BAG_LANES + t];
      uint candidate_row = bag_rows[slice * BAG_LANES + t];
      bool better = candidate > value || (candidate == value && candidate_row < row);
      if (candidate_row != NO_ROW && (row == NO_ROW || better)) {
        value = candidate;
        row = candidate_row;
      }
    }
  barrier();
}

#endif
