#include "data/pcam_file.h"

#include <hdf5.h>

#include <algorithm>
#include <vector>

#include "common/error.h"
#include "common/hdf5_lock.h"

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
    H5Tclose(x_type);
    if (x_dims.size() != 4 || x_dims[3] != 3 || !integer) fail("x", "must be uint8 [N,H,W,3]");
    count_ = x_dims[0];
    height_ = static_cast<int>(x_dims[1]);
    width_ = static_cast<int>(x_dims[2]);
    auto y_dims = dims(y_);
    hsize_t per_label = 1;
    for (size_t d = 1; d < y_dims.size(); ++d) per_label *= y_dims[d];
    if (y_dims.empty() || y_dims[0] != count_ || per_label != 1)
      fail("y", "must hold one label per patch ([N] or [N,1,1,1]) for the " + std::to_string(count_) + " patches of x");
    read_labels();
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
  std::string description() const override { return path_; }

  uint32_t read(size_t index, uint8_t* rgb) const override {
    if (!rgb) return labels_.at(index);
    const Hdf5Lock hdf5_lock;
    hid_t space = H5Dget_space(x_);
    hsize_t start[4] = {index, 0, 0, 0};
    hsize_t count[4] = {1, static_cast<hsize_t>(height_), static_cast<hsize_t>(width_), 3};
    H5Sselect_hyperslab(space, H5S_SELECT_SET, start, nullptr, count, nullptr);
    hid_t memory = H5Screate_simple(4, count, nullptr);
    herr_t status = H5Dread(x_, H5T_NATIVE_UINT8, memory, space, H5P_DEFAULT, rgb);
    H5Sclose(memory);
    H5Sclose(space);
    if (status < 0)
      throw BadInput(path_ + ": dataset x: patch " + std::to_string(index) + " cannot be read (truncated or corrupt)");
    return labels_[index];
  }

 private:
  // Labels are small: read them once, also to know the class count. Read as they are stored
  // (HDF5 would clip int8 -1 to 0 and truncate 0.7 to 0), and refuse what is not a class index.
  void read_labels() {
    hid_t type = H5Dget_type(y_);
    bool integer = H5Tget_class(type) == H5T_INTEGER;
    H5Tclose(type);
    if (!integer) fail("y", "must hold integer class indices (uint8 in the PCam layout), not floating point");
    std::vector<int64_t> stored(count_);
    if (count_ && H5Dread(y_, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, stored.data()) < 0)
      fail("y", "cannot be read (truncated or corrupt)");
    std::vector<size_t> per_class;
    for (size_t i = 0; i < count_; ++i) {
      if (stored[i] < 0 || stored[i] > 255)
        fail("y", "label " + std::to_string(stored[i]) + " of patch " + std::to_string(i) + " is not a class index in [0, 255]");
      auto label = static_cast<size_t>(stored[i]);
      if (label >= per_class.size()) per_class.resize(label + 1);
      per_class[label]++;
      labels_.push_back(static_cast<uint8_t>(label));
    }
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
  std::vector<uint8_t> labels_;
};

}  // namespace

std::unique_ptr<PatchSource> open_pcam_file(const std::string& path) { return std::make_unique<PcamFile>(path); }

}  // namespace tessera::data
