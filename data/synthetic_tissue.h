// The tissue of a synthetic slide (internal to data/, behind tessera synth): tissue and tumour
// regions are star-shaped polygons drawn from the seed; every pixel of every pyramid level is
// computed from them and from hashed cell grids (stroma texture, nuclei), so no level is ever
// held in memory and the tumour polygons are the exact boundaries. Bright-field: H&E-like RGB on
// bright glass; fluorescence: a multiplex panel (DAPI, panCK, autofluorescence, immune cells)
// on a dark background, or its RGB composite.
#pragma once
#include <cstdint>
#include <memory>

#include <nlohmann/json.hpp>

namespace tessera::data {

class SyntheticTissue {
 public:
  // `tumour` false: the same tissue and stain without the tumour regions.
  SyntheticTissue(int64_t width, int64_t height, uint64_t seed, bool tumour, bool fluorescence, int channels);
  ~SyntheticTissue();

  // Renders the size x size tile at (x0, y0) of the level with `downsample`, channels() bytes a
  // pixel; returns false (leaving `pixels` alone) when the tile holds background only.
  bool render(double downsample, int64_t x0, int64_t y0, int size, uint8_t* pixels) const;
  // Every channel's value where there is no tissue.
  uint8_t background() const;
  int channels() const;

  bool in_tumour(double x, double y) const;
  double tissue_area() const;
  double tumour_area() const;
  size_t tumour_count() const;
  // The closed exterior ring of tumour `index` as GeoJSON positions, level-0 pixels.
  nlohmann::json tumour_ring(size_t index) const;

 private:
  struct Model;
  std::unique_ptr<Model> model_;
};

}  // namespace tessera::data
