// Patch coordinates made by other tools (extract --coords), so that a lab keeps the tissue
// segmentation it has: CLAM's create_patches_fp (`patches/SLIDE.h5`) and TRIDENT's patching
// (`patches/SLIDE_patches.h5`). Both hold `coords`, int64 [N,2], each patch's top-left corner in
// level-0 pixels; CLAM's attributes give patch_size at patch_level, TRIDENT's patch_size at its
// target magnification and patch_size_level0 (an integer, or a float since TRIDENT 0.2.4).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/slide.h"
#include "data/tile_source.h"

namespace tessera::data {

struct PatchCoords {
  std::string file;
  std::string layout;  // "trident" (patch_size_level0 given) or "clam"
  std::vector<TileOrigin> origins;
  std::string name;             // the slide the file names (attribute `name`); empty when absent
  int64_t patch_size = 0;       // pixels a side at patch_level (CLAM) or at the target magnification
  int64_t patch_level = 0;      // CLAM's; 0 for TRIDENT's, which read from level 0
  double patch_size_level0 = 0;  // TRIDENT's; 0 for CLAM's
  int64_t level0_width = 0, level0_height = 0;  // the slide's size where the file records it; else 0
  // TRIDENT's level0_magnification and target_magnification, which its feature files copy; 0
  // where the file has none (CLAM's).
  double level0_magnification = 0, target_magnification = 0;

  // A patch's side in level-0 pixels on `slide`. Throws BadInput naming the file when its
  // patch_level is not a level of the slide.
  double extent(const Slide& slide) const;
  // Throws BadInput naming the file and the slide when the file is another slide's (its name or
  // its recorded size differ), or when a patch's corner lies outside the slide (naming the first,
  // by row, and how many).
  void check_fits(const Slide& slide, const std::string& slide_path) const;
};

// Reads and checks a coordinates file. Throws BadInput naming the file and what is wrong: not
// HDF5, no `coords`, not [N,2] integers, a patch_size that is not a whole number of pixels, a
// negative coordinate.
PatchCoords read_patch_coords(const std::string& path);

// The coordinates file of the slide named `stem` in `directory`: STEM_patches.h5 or STEM.h5, in
// the directory or in its `patches/`. Empty when there is none; BadInput naming both when two are.
std::string find_patch_coords(const std::string& directory, const std::string& stem);

}  // namespace tessera::data
