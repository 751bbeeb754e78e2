// PCam-layout HDF5 patch files as a PatchSource.
#pragma once
#include <memory>
#include <string>

#include "data/patches.h"

namespace tessera::data {

// Opens `x` uint8 [N,H,W,3] and `y` uint8 [N] or [N,1,1,1]; throws BadInput naming the file.
std::unique_ptr<PatchSource> open_pcam_file(const std::string& path);

}  // namespace tessera::data
