// Labelled patches (RGB, or a multiplex slide's channels) by index: the interface between patch storage (a PCam-layout HDF5
// file, an LMDB tile store) and the training loader.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tessera::data {

class PatchSource {
 public:
  virtual ~PatchSource() = default;
  virtual size_t size() const = 0;
  virtual int height() const = 0;
  virtual int width() const = 0;
  // Samples a pixel: 3 (RGB), or a multiplex slide's channels.
  virtual int channels() const { return 3; }
  // Whether they are RGB rather than a multiplex slide's planes (which may be 3 too).
  virtual bool rgb() const { return channels() == 3; }
  // One more than the largest label.
  virtual uint32_t class_count() const = 0;
  // The group a patch belongs to (its slide): training and validation never share a group.
  // Sources without slides put every patch in its own group.
  virtual uint64_t group(size_t index) const = 0;
  // Patches of each class (index = label) in `group`, as the source records them: what the
  // split divides and reports without decoding a patch.
  virtual std::vector<uint64_t> class_counts(uint64_t group) const = 0;
  // The slide `group` is (its path as recorded); empty where each patch is its own group.
  virtual std::string group_name(uint64_t group) const {
    (void)group;
    return {};
  }
  // Writes the patch as height x width x channels() uint8 (row-major) and returns its label; with
  // `rgb` null, returns the label alone and decodes nothing. Safe to call from several threads
  // at once. Throws BadInput naming the file and patch.
  virtual uint32_t read(size_t index, uint8_t* rgb) const = 0;
  virtual std::string description() const = 0;
};

// "3 channels (RGB)", "3 channels (planes)", "5 channels": what a slide's tiles hold, in messages.
inline std::string channels_in_words(int channels, bool rgb) {
  std::string words = std::to_string(channels) + (channels == 1 ? " channel" : " channels");
  return channels == 3 ? words + (rgb ? " (RGB)" : " (planes)") : words;
}

// Opens a PCam-layout HDF5 file (`x` uint8 [N,H,W,3], `y` uint8 [N] or [N,1,1,1]) or an LMDB
// tile store (a directory or a file ending in .lmdb), by what is at `path`.
std::unique_ptr<PatchSource> open_patches(const std::string& path);

// One path as above, or several LMDB tile stores, or a directory holding tile stores, read as one
// source (tile_store.h's open_tile_stores: slides by content, a store named twice refused).
std::unique_ptr<PatchSource> open_patches(const std::vector<std::string>& paths);

}  // namespace tessera::data
