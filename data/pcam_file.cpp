#include "data/pcam_file.h"

#include <hdf5.h>

#include <algorithm>
#include <vector>

#include "common/checked.h"
#include "common/error.h"
#include "common/hdf5_lock.h"
#include "data/tile_format.h"

namespace tessera::data {

namespace {

class PcamFile : public PatchSource {
 public:
  explicit PcamFile(const std::string& path) : path_(path) {
    const Hdf5Lock hdf5_lock;
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (file_ < 0) throw BadInput(path + ": cannot open as HDF5 (missing, unreadable or not an HDF5 file)");
    x_ = open_dataset("x");
    y_ = open_dataset("y");
    auto x_dims = dims(x_);
    hid_t x_type = H5Dget_type(x_);
    bool integer = H5Tget_class(x_type) == H5T_INTEGER;
    // Integers wider than a byte, or signed, are read as they are stored and checked per patch.
    check_pixels_ = !(H5Tget_size(x_type) == 1 && H5Tget_sign(x_type) == H5T_SGN_NONE);
    H5Tclose(x_type);
    if (x_dims.size() != 4 || x_dims[3] != 3 || !integer) fail("x", "must be uint8 [N,H,W,3]");
    if (x_dims[1] < 1 || x_dims[2] < 1 || x_dims[1] > hsize_t{max_tile_size} || x_dims[2] > hsize_t{max_tile_size})
      fail("x", "holds patches of " + std::to_string(x_dims[1]) + "x" + std::to_string(x_dims[2]) +
                    " pixels; tessera reads 1 to " + std::to_string(max_tile_size) + " a side");
    if (x_dims[1] * x_dims[2] * 3 > max_tile_pixel_bytes)  // each side at most 65535: no overflow
      fail("x", "holds patches of " + std::to_string(x_dims[1]) + "x" + std::to_string(x_dims[2]) + " pixels, " +
                    std::to_string(x_dims[1] * x_dims[2] * 3) + " bytes each; tessera reads patches of at most " +
                    std::to_string(max_tile_pixel_bytes) + " bytes (256 MiB)");
    count_ = x_dims[0];
    height_ = static_cast<int>(x_dims[1]);
    width_ = static_cast<int>(x_dims[2]);
    auto y_dims = dims(y_);
    hsize_t per_label = 1;  // checked: dimensions whose product wraps to 1 are not one label
    for (size_t d = 1; d < y_dims.size(); ++d)
      per_label = multiply(per_label, y_dims[d], Field(path, "dataset y shape"));
    if (y_dims.empty() || y_dims[0] != count_ || per_label != 1)
      fail("y", "must hold one label per patch ([N] or [N,1,1,1]) for the " + std::to_string(count_) + " patches of x");
    check_written("x", x_);
    check_written("y", y_);
    read_labels(y_dims);
  }

  ~PcamFile() override {
    const Hdf5Lock hdf5_lock;
    if (x_ >= 0) H5Dclose(x_);
    if (y_ >= 0) H5Dclose(y_);
    if (file_ >= 0) H5Fclose(file_);
  }

  size_t size() const override { return count_; }
  int height() const override { return height_; }
  int width() const override { return width_; }
  uint32_t class_count() const override { return classes_; }
  uint64_t group(size_t index) const override { return index; }
  std::vector<uint64_t> class_counts(uint64_t group) const override {
    std::vector<uint64_t> counts(labels_.at(group) + size_t{1});
    counts.back() = 1;
    return counts;
  }
  std::string description() const override { return path_; }

  uint32_t read(size_t index, uint8_t* rgb) const override {
    if (!rgb) return labels_.at(index);
    const Hdf5Lock hdf5_lock;
    hid_t space = H5Dget_space(x_);
    hsize_t start[4] = {index, 0, 0, 0};
    hsize_t count[4] = {1, static_cast<hsize_t>(height_), static_cast<hsize_t>(width_), 3};
    H5Sselect_hyperslab(space, H5S_SELECT_SET, start, nullptr, count, nullptr);
    hid_t memory = H5Screate_simple(4, count, nullptr);
    size_t values = static_cast<size_t>(height_) * static_cast<size_t>(width_) * 3;
    std::vector<int64_t> wide(check_pixels_ ? values : 0);
    herr_t status = check_pixels_ ? H5Dread(x_, H5T_NATIVE_INT64, memory, space, H5P_DEFAULT, wide.data())
                                  : H5Dread(x_, H5T_NATIVE_UINT8, memory, space, H5P_DEFAULT, rgb);
    H5Sclose(memory);
    H5Sclose(space);
    if (status < 0)
      throw BadInput(path_ + ": dataset x: patch " + std::to_string(index) + " cannot be read (truncated or corrupt)");
    for (size_t i = 0; i < wide.size(); ++i) {
      if (wide[i] < 0 || wide[i] > 255)
        throw BadInput(path_ + ": dataset x: patch (row) " + std::to_string(index) + " holds " +
                       std::to_string(wide[i]) + " at pixel " + std::to_string(i / 3 % static_cast<size_t>(width_)) +
                       "," + std::to_string(i / 3 / static_cast<size_t>(width_)) + " channel " + std::to_string(i % 3) +
                       ": pixels must be 0-255");
      rgb[i] = static_cast<uint8_t>(wide[i]);
    }
    return labels_[index];
  }

 private:
  // Labels are small: read them once, also to know the class count. Read as they are stored
  // (HDF5 would clip int8 -1 to 0 and truncate 0.7 to 0), and refuse what is not a class index.
  // In blocks, so that memory follows the labels (a byte each), not their stored width.
  void read_labels(const std::vector<hsize_t>& y_dims) {
    hid_t type = H5Dget_type(y_);
    bool integer = H5Tget_class(type) == H5T_INTEGER;
    H5Tclose(type);
    if (!integer) fail("y", "must hold integer class indices (uint8 in the PCam layout), not floating point");
    constexpr hsize_t block = hsize_t{1} << 20;
    std::vector<int64_t> stored;
    std::vector<size_t> per_class;
    labels_.reserve(count_);
    hid_t space = H5Dget_space(y_);
    for (hsize_t first = 0; first < count_; first += block) {
      hsize_t rows = std::min(block, count_ - first);
      std::vector<hsize_t> start(y_dims.size(), 0), extent = y_dims;
      start[0] = first;
      extent[0] = rows;
      stored.resize(rows);
      H5Sselect_hyperslab(space, H5S_SELECT_SET, start.data(), nullptr, extent.data(), nullptr);
      hid_t memory = H5Screate_simple(1, &rows, nullptr);
      herr_t status = H5Dread(y_, H5T_NATIVE_INT64, memory, space, H5P_DEFAULT, stored.data());
      H5Sclose(memory);
      if (status < 0) {
        H5Sclose(space);
        fail("y", "cannot be read (truncated or corrupt)");
      }
      for (size_t i = 0; i < rows; ++i) {
        if (stored[i] < 0 || stored[i] > 255) {
          H5Sclose(space);
          fail("y", "label " + std::to_string(stored[i]) + " of patch " + std::to_string(first + i) +
                        " is not a class index in [0, 255]");
        }
        auto label = static_cast<size_t>(stored[i]);
        if (label >= per_class.size()) per_class.resize(label + 1);
        per_class[label]++;
        labels_.push_back(static_cast<uint8_t>(label));
      }
    }
    H5Sclose(space);
    // Classes are 0..K-1, each with patches (0 and 1 of a binary task may stand alone): a lone
    // 255 among 0s and 1s is a broken label, not the sign of a 256-class task.
    for (size_t c = 0; per_class.size() > 2 && c < per_class.size(); ++c)
      if (per_class[c] == 0)
        fail("y", "has labels up to " + std::to_string(per_class.size() - 1) + " but no patch of class " +
                      std::to_string(c) + ": labels must be the class indices 0..K-1");
    classes_ = static_cast<uint32_t>(per_class.size());
  }
  [[noreturn]] void fail(const std::string& dataset, const std::string& problem) const {
    throw BadInput(path_ + ": dataset " + dataset + " " + problem);
  }
  // A dataset's rows must be backed by data in the file: every chunk written, or contiguous
  // storage inside the file. An unwritten dataset reads as its fill value, whatever it declares.
  void check_written(const char* name, hid_t dataset) const {
    auto shape = dims(dataset);
    hid_t properties = H5Dget_create_plist(dataset);
    H5D_layout_t layout = H5Pget_layout(properties);
    std::vector<hsize_t> chunk(shape.size());
    if (layout == H5D_CHUNKED) H5Pget_chunk(properties, static_cast<int>(chunk.size()), chunk.data());
    H5Pclose(properties);
    std::string declared = "declares [";
    long double chunks = 1, values = 1;
    for (size_t d = 0; d < shape.size(); ++d) {
      declared += (d ? "," : "") + std::to_string(shape[d]);
      values *= static_cast<long double>(shape[d]);
      if (layout == H5D_CHUNKED && chunk[d]) chunks *= static_cast<long double>((shape[d] + chunk[d] - 1) / chunk[d]);
    }
    declared += "]";
    if (values == 0) return;
    if (layout == H5D_VIRTUAL) fail(name, "is a virtual dataset (its data lives in other files)");
    if (layout == H5D_CHUNKED) {
      hsize_t written = 0;
      hid_t space = H5Dget_space(dataset);  // HDF5 1.10 refuses H5S_ALL here
      herr_t status = H5Dget_num_chunks(dataset, space, &written);
      H5Sclose(space);
      if (status < 0 || static_cast<long double>(written) < chunks)
        fail(name, declared + " but only " + std::to_string(written) + " of its " +
                       std::to_string(static_cast<unsigned long long>(chunks)) +
                       " chunks hold data (an unwritten or cut-short file)");
    } else if (layout == H5D_CONTIGUOUS) {
      H5D_space_status_t status = H5D_SPACE_STATUS_ERROR;
      H5Dget_space_status(dataset, &status);
      hsize_t file_size = 0, stored = H5Dget_storage_size(dataset);
      H5Fget_filesize(file_, &file_size);
      haddr_t offset = H5Dget_offset(dataset);
      hid_t type = H5Dget_type(dataset);
      long double bytes = values * static_cast<long double>(H5Tget_size(type));
      H5Tclose(type);
      if (status != H5D_SPACE_STATUS_ALLOCATED || offset == HADDR_UNDEF || static_cast<long double>(stored) < bytes ||
          offset + stored > file_size)
        fail(name, declared + " (" + std::to_string(static_cast<unsigned long long>(bytes)) +
                       " bytes) but the file holds " + (offset == HADDR_UNDEF ? "none of them" : "less"));
    }
  }
  hid_t open_dataset(const char* name) {
    if (H5Lexists(file_, name, H5P_DEFAULT) <= 0) fail(name, "is missing (a PCam-layout file has x and y)");
    hid_t dataset = H5Dopen2(file_, name, H5P_DEFAULT);
    if (dataset < 0) fail(name, "cannot be opened");
    return dataset;
  }
  static std::vector<hsize_t> dims(hid_t dataset) {
    hid_t space = H5Dget_space(dataset);
    std::vector<hsize_t> result(static_cast<size_t>(std::max(0, H5Sget_simple_extent_ndims(space))));
    H5Sget_simple_extent_dims(space, result.data(), nullptr);
    H5Sclose(space);
    return result;
  }

  std::string path_;
  hid_t file_ = -1, x_ = -1, y_ = -1;
  size_t count_ = 0;
  int height_ = 0, width_ = 0;
  uint32_t classes_ = 0;
  bool check_pixels_ = false;  // x is not uint8: each patch is read wide and checked to be 0-255
  std::vector<uint8_t> labels_;
};

}  // namespace

std::unique_ptr<PatchSource> open_pcam_file(const std::string& path) { return std::make_unique<PcamFile>(path); }

}  // namespace tessera::data
