// TransMIL's square grid (szc19990412/TransMIL models/TransMIL.py: H = ceil(sqrt(n))), from the
// bag's instance count on the device, so that one recorded step serves bags of any size: n
// instances sit on a side x side grid, the least side with side * side >= n, after the class
// token, so the sequence holds 1 + side * side rows.
#ifndef TESSERA_TRANSMIL_GRID_GLSL
#define TESSERA_TRANSMIL_GRID_GLSL

uint transmil_grid_side(uint instances) {
  uint side = uint(ceil(sqrt(float(instances))));
  // float(instances) and sqrt round (past 2^24 a float misses whole numbers): the estimate may
  // miss by one either way, corrected with whole numbers.
  while (side * side < instances) ++side;
  while (side > 0u && (side - 1u) * (side - 1u) >= instances) --side;
  return side;
}

// The rows of the sequence: the class token and the grid.
uint transmil_sequence_length(uint instances) {
  uint side = transmil_grid_side(instances);
  return 1u + side * side;
}

#endif
