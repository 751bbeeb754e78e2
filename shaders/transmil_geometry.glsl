// TransMIL's sequence for a bag of n patches (szc19990412/TransMIL, TransMIL.forward): the
// patches wrapped around to fill a side x side square, side the least with side^2 >= n, after
// the class token. Kernels derive it from the bag's count on the device, so that one recorded
// step serves bags of any size.
#ifndef TESSERA_TRANSMIL_GEOMETRY_GLSL
#define TESSERA_TRANSMIL_GEOMETRY_GLSL

uint transmil_side(uint patches) {
  uint side = uint(ceil(sqrt(float(patches))));  // then corrected: float sqrt may round either way
  while (side * side < patches) ++side;
  while (side > 1u && (side - 1u) * (side - 1u) >= patches) --side;
  return side;
}

uint transmil_sequence_length(uint patches) {
  uint side = transmil_side(patches);
  return 1u + side * side;
}

#endif
