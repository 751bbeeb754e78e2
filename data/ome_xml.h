// OME-XML as the OME schema (2016-06) defines it, internal to data/: the Pixels of an OME-TIFF's
// first Image, every number checked before anything is sized from it, and the TIFF directory of
// each (C, Z, T) plane from its TiffData. Also the little XML that OME's and QPTIFF's descriptions
// need: start tags, attributes (entities decoded) and element text, always valid UTF-8.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tessera::data {

// The start tags of `element` in `xml` ("<Channel ID=... Name=...", without the closing '>').
std::vector<std::string> xml_start_tags(const std::string& xml, const std::string& element);
// An attribute of a start tag, entities decoded and made valid UTF-8; nothing when absent.
std::optional<std::string> xml_attribute(const std::string& tag, const std::string& name);
// The text of the first <element>...</element>, entities decoded and made valid UTF-8; "" when absent.
std::string xml_element_text(const std::string& xml, const std::string& element);

// Channels a tile header holds (data/tile_format.h): a slide of more is refused.
constexpr int64_t max_slide_channels = 255;

struct OmeChannel {
  std::string name;
  int64_t samples_per_pixel = 1;
};

struct OmePixels {
  std::string dimension_order;  // a permutation of XYZCT beginning XY
  std::string type;             // uint8, uint16, int8, float ...
  int64_t size_x = 0, size_y = 0, size_c = 0, size_z = 0, size_t_ = 0;
  std::vector<OmeChannel> channels;
  int64_t samples_per_pixel = 1;       // of every channel: 3 for an RGB image, else 1
  double microns_per_pixel = 0;        // PhysicalSizeX in microns; 0 when not given (or in pixels)
  std::vector<std::string> files;      // UUID FileName of TiffData blocks
  std::vector<std::string> tiff_data;  // TiffData start tags
  size_t images = 1;                   // Image elements in the document

  // Planes a (Z, T) point holds: SizeC, or SizeC / SamplesPerPixel where samples are interleaved.
  int64_t channel_planes() const { return size_c / samples_per_pixel; }
  // The index of plane (c, z, t) in DimensionOrder, the order TiffData's PlaneCount runs in.
  int64_t plane_index(int64_t c, int64_t z, int64_t t) const;
};

// Reads the first Pixels element of `xml` (the OME-XML of `path`) and checks it as the schema
// defines it: DimensionOrder one of its six permutations, SizeX/Y/C/Z/T present and at least 1
// (SizeC at most max_slide_channels; the others at most 2^31), Type one of the schema's pixel
// types, SamplesPerPixel that add up to SizeC, PhysicalSizeX positive and finite. Throws BadInput
// naming the file and the field ("slide.ome.tiff: OME-XML Pixels SizeC is 0, ..."). Nothing when
// `xml` has no Pixels element.
std::optional<OmePixels> read_ome_pixels(const std::string& xml, const std::string& path);

// The TIFF directory (of the main chain, which holds `directories`) of every plane, indexed by
// OmePixels::plane_index, from the TiffData blocks (IFD, PlaneCount, FirstC/Z/T) or, with none,
// plane i in directory i. Every plane must be mapped, once, to a distinct directory the file has;
// anything else is BadInput naming the TiffData block and its field. Checked before anything is
// allocated: a file cannot declare more planes than it has directories.
std::vector<uint32_t> ome_plane_directories(const OmePixels& pixels, const std::string& path, uint32_t directories);

}  // namespace tessera::data
