#include "compute/feature_file.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <utility>

#include <unistd.h>

#include "common/error.h"
#include "common/json_input.h"
#include "common/files.h"
#include "common/hdf5_lock.h"
#include "common/units.h"
#include "compute/tensor.h"

namespace tessera {

namespace fs = std::filesystem;
using hdf5::Handle;

namespace {

// IEEE 754 binary16, which h5py reads as numpy float16. Written from to_half's bits with this
// type in memory too: HDF5's own float32 conversion to it rounds wrongly just below a power of
// two (0.031249 stored as 0.015625).
hid_t float16_type() {
  hid_t type = H5Tcopy(H5T_IEEE_F32LE);
  H5Tset_fields(type, 15, 10, 5, 0, 10);
  H5Tset_precision(type, 16);
  H5Tset_size(type, 2);
  H5Tset_ebias(type, 15);
  return type;
}

std::string disk_message(const std::string &file, const std::string &what) {
  return file + ": cannot " + what +
         " (is the disk full? the rows flushed before are kept; free some "
         "space and run the same command again "
         "to resume)";
}

int64_t extent_rows(hid_t dataset) {
  Handle space(H5Dget_space(dataset), H5Sclose);
  hsize_t dims[2] = {0, 0};
  if (H5Sget_simple_extent_ndims(space) != 2) return -1;
  H5Sget_simple_extent_dims(space, dims, nullptr);
  return static_cast<int64_t>(dims[0]);
}

// The model's path is a record of where it came from; its weights' hash says what it is.
nlohmann::json identity(nlohmann::json extraction) {
  if (extraction.is_object()) extraction.erase("model");
  return extraction;
}

nlohmann::json json_attribute(hid_t object, const char *name) {
  auto text = hdf5::read_string_attribute(object, name);
  // One that is not JSON says nothing: the file is then not this run's.
  auto parsed = text ? try_parse_json_input(*text) : std::nullopt;
  return parsed ? std::move(*parsed) : nlohmann::json();
}

std::string describe_slide(const nlohmann::json &slide) {
  if (!slide.is_object()) return "a slide it does not name";
  return slide.value("path", "?") + " (" + slide.value("fingerprint", "no fingerprint") + ", " +
         std::to_string(slide.value("tiles", 0)) + " tiles)";
}

// ---- CLAM and TRIDENT attributes ----------------------------------------------------------
// The names, types and places their readers use, beside tessera's own: CLAM's create_patches_fp
// (wsi_core/WholeSlideImage.py: coords' downsampled_level_dim, save_path) and TRIDENT's
// coords_to_h5 and extract_features (trident/IO.py, wsi_objects/WSI.py: patch_size_level0,
// level0_magnification, target_magnification, overlap, level0_width/height, savetodir on coords;
// name, savetodir, encoder on features).

void write_interchange_attributes(hid_t features, hid_t coords, const FeatureFileLayout &layout) {
  // Where the file was written, as "." (its own directory): a file is the same bytes whatever
  // --out it was written to, and stays true when moved. Neither tool reads these back.
  const std::string here = ".";
  int64_t level_dim[2] = {layout.level_width, layout.level_height};
  hdf5::write_attribute(coords, "downsampled_level_dim", H5T_NATIVE_INT64, {2}, level_dim);
  hdf5::write_string_attribute(coords, "save_path", here);
  auto patch_size_level0 = static_cast<int64_t>(std::llround(static_cast<double>(layout.patch_size) * layout.downsample));
  int64_t overlap = 0;
  hdf5::write_attribute(coords, "patch_size_level0", H5T_NATIVE_INT64, {}, &patch_size_level0);
  hdf5::write_attribute(coords, "overlap", H5T_NATIVE_INT64, {}, &overlap);
  hdf5::write_attribute(coords, "level0_width", H5T_NATIVE_INT64, {}, &layout.level0_width);
  hdf5::write_attribute(coords, "level0_height", H5T_NATIVE_INT64, {}, &layout.level0_height);
  hdf5::write_string_attribute(coords, "savetodir", here);
  // Magnifications only where the slide gives its pixel size; TRIDENT reads a file without them
  // as CLAM's (patch_size, patch_level).
  if (layout.level0_magnification > 0 && layout.target_magnification > 0) {
    hdf5::write_attribute(coords, "level0_magnification", H5T_NATIVE_INT64, {}, &layout.level0_magnification);
    const double target = layout.target_magnification;
    if (auto whole = static_cast<int64_t>(std::llround(target)); std::abs(target - static_cast<double>(whole)) < 1e-9)
      hdf5::write_attribute(coords, "target_magnification", H5T_NATIVE_INT64, {}, &whole);
    else
      hdf5::write_attribute(coords, "target_magnification", H5T_NATIVE_DOUBLE, {}, &target);
  }
  hdf5::write_string_attribute(features, "name", layout.name);
  hdf5::write_string_attribute(features, "savetodir", here);
  hdf5::write_string_attribute(features, "encoder", layout.encoder);
}
// -------------------------------------------------------------------------------------------

}  // namespace

int64_t trident_magnification(double mpp) {
  if (!(mpp > 0) || mpp >= 2.4) return 0;
  for (auto [below, magnification] : {std::pair{0.16, 80}, {0.2, 60}, {0.3, 40}, {0.6, 20}, {1.2, 10}})
    if (mpp < below) return magnification;
  return 5;
}

FeatureFileState feature_file_state(const std::string &path, const FeatureFileLayout &layout,
                                    std::string *difference) {
  const Hdf5Lock hdf5_lock;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  if (!output_exists(path)) return FeatureFileState::absent;
  auto other = [&](const std::string &why) {
    if (difference) *difference = why;
    return FeatureFileState::other;
  };
  if (!is_plain_file(path)) return other("something that is not a feature file (a link or a directory)");
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) return other("something that is not an HDF5 file (or a truncated one)");
  nlohmann::json extraction, slide;
  if (H5Lexists(file, "features", H5P_DEFAULT) > 0) {
    Handle features(H5Dopen2(file, "features", H5P_DEFAULT), H5Dclose);
    if (features.valid()) {
      extraction = json_attribute(features, "extraction");
      slide = json_attribute(features, "slide");
    }
  }
  if (slide != layout.slide)
    return other("the features of " + describe_slide(slide) + "; this run's slide is " + describe_slide(layout.slide));
  if (identity(extraction) != identity(layout.extraction))
    return other("features made with " + (extraction.is_null() ? "unknown settings" : extraction.dump()) +
                 "; this run makes " + layout.extraction.dump());
  return FeatureFileState::complete;
}

void check_feature_file_replaceable(const std::string &path, const FeatureFileLayout &layout, Existing existing) {
  std::string difference;
  if (existing == Existing::overwrite || feature_file_state(path, layout, &difference) != FeatureFileState::other)
    return;
  throw UsageError(path + " holds " + difference +
                   ": write to another --out, or give --overwrite to replace it");
}

FeatureFileWriter::FeatureFileWriter(const std::string &path, const FeatureFileLayout &layout, Existing existing)
    : path_(path), partial_(path + ".partial"), rows_path_(path + ".partial.rows"), slide_name_(layout.name),
      lock_(path), width_(layout.width), fp16_(layout.fp16) {
  const Hdf5Lock hdf5_lock;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  // Judged under the lock: another run may have finished the file since this one looked.
  if (feature_file_state(path, layout) == FeatureFileState::complete) {
    complete_ = true;
    // Its rows, for the run's report.
    Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    Handle coords(file.valid() ? H5Dopen2(file, "coords", H5P_DEFAULT) : -1, H5Dclose);
    rows_ = coords.valid() ? std::max<int64_t>(extent_rows(coords), 0) : 0;
    return;
  }
  check_feature_file_replaceable(path, layout, existing);
  if (!resume(layout)) create(layout);
}

FeatureFileWriter::~FeatureFileWriter() { close(); }

void FeatureFileWriter::close() {
  const Hdf5Lock hdf5_lock;
  for (hid_t *dataset : {&features_, &coords_})
    if (*dataset >= 0) H5Dclose(std::exchange(*dataset, -1));
  if (file_ >= 0) H5Fclose(std::exchange(file_, -1));
}

bool FeatureFileWriter::resume(const FeatureFileLayout &layout) {
  // The row count is recorded after each flush: rows past it may be half
  // written by a killed run.
  std::ifstream rows_file(rows_path_);
  int64_t flushed = -1;
  if (!is_plain_file(partial_) || !is_plain_file(rows_path_) || !(rows_file >> flushed) || flushed < 0) return false;
  file_ = H5Fopen(partial_.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  if (file_ < 0) return false;
  features_ = H5Dopen2(file_, "features", H5P_DEFAULT);
  coords_ = H5Dopen2(file_, "coords", H5P_DEFAULT);
  bool same = false;
  if (features_ >= 0 && coords_ >= 0) {
    Handle space(H5Dget_space(features_), H5Sclose);
    hsize_t dims[2] = {0, 0};
    H5Sget_simple_extent_dims(space, dims, nullptr);
    same = static_cast<int64_t>(dims[1]) == layout.width &&
           hdf5::read_string_attribute(features_, "extraction") == layout.extraction.dump() &&
           hdf5::read_string_attribute(features_, "slide") == layout.slide.dump() &&
           std::min(extent_rows(features_), extent_rows(coords_)) >= flushed;
  }
  if (!same) {
    close();
    return false;
  }
  rows_ = flushed;
  hsize_t feature_dims[2] = {static_cast<hsize_t>(rows_), static_cast<hsize_t>(width_)};
  hsize_t coord_dims[2] = {static_cast<hsize_t>(rows_), 2};
  if (H5Dset_extent(features_, feature_dims) < 0 || H5Dset_extent(coords_, coord_dims) < 0)
    throw Error(ExitCode::runtime_error, disk_message(partial_, "truncate to the last flushed row"));
  return true;
}

void FeatureFileWriter::create(const FeatureFileLayout &layout) {
  file_ = hdf5::create_file(partial_);
  // Chunks of about 256 KiB of features: small enough to append, large enough
  // to read fast.
  hsize_t chunk_rows = static_cast<hsize_t>(std::clamp<int64_t>((256 << 10) / (4 * layout.width), 16, 4096));
  auto make = [&](const char *name, hid_t type, hsize_t columns) {
    hsize_t dims[2] = {0, columns}, max_dims[2] = {H5S_UNLIMITED, columns}, chunk[2] = {chunk_rows, columns};
    Handle space(H5Screate_simple(2, dims, max_dims), H5Sclose);
    Handle properties(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_chunk(properties, 2, chunk);
    if (layout.gzip) {
      H5Pset_shuffle(properties);
      H5Pset_deflate(properties, 4);
    }
    hid_t dataset = H5Dcreate2(file_, name, type, space, H5P_DEFAULT, properties, H5P_DEFAULT);
    if (dataset < 0) throw Error(ExitCode::runtime_error, disk_message(partial_, std::string("create ") + name));
    return dataset;
  };
  Handle half(float16_type(), H5Tclose);
  features_ = make("features", layout.fp16 ? static_cast<hid_t>(half) : H5T_IEEE_F32LE, static_cast<hsize_t>(width_));
  coords_ = make("coords", H5T_STD_I64LE, 2);
  hdf5::write_string_attribute(features_, "extraction", layout.extraction.dump());
  hdf5::write_string_attribute(features_, "slide", layout.slide.dump());
  hdf5::write_string_attribute(features_, "pooling", layout.extraction.value("pooling", ""));
  hdf5::write_attribute(coords_, "patch_size", H5T_NATIVE_INT64, {}, &layout.patch_size);
  hdf5::write_attribute(coords_, "patch_level", H5T_NATIVE_INT64, {}, &layout.patch_level);
  double downsample[2] = {layout.downsample, layout.downsample};
  hdf5::write_attribute(coords_, "downsample", H5T_NATIVE_DOUBLE, {2}, downsample);
  int64_t level_dim[2] = {layout.level_width, layout.level_height};
  hdf5::write_attribute(coords_, "level_dim", H5T_NATIVE_INT64, {2}, level_dim);
  hdf5::write_string_attribute(coords_, "name", layout.name);
  write_interchange_attributes(features_, coords_, layout);
  if (H5Fflush(file_, H5F_SCOPE_GLOBAL) < 0) throw Error(ExitCode::runtime_error, disk_message(partial_, "flush"));
  rows_ = 0;
  record_rows();
}

void FeatureFileWriter::record_rows() {
  std::string temporary = rows_path_ + ".new", text = std::to_string(rows_) + "\n";
  {
    UniqueFd out = create_new_file(temporary);
    if (::write(out.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()))
      throw Error(ExitCode::runtime_error, disk_message(temporary, "write"));
  }
  std::error_code error;
  fs::rename(temporary, rows_path_, error);
  if (error) throw Error(ExitCode::runtime_error, disk_message(rows_path_, "rename: " + error.message()));
}

BadInput FeatureFileWriter::refusal(float value, int64_t column, const int64_t *coords) const {
  std::string what = format_number(static_cast<double>(value));
  if (std::isfinite(value)) what += ", past float16's largest value (65504): extract it with --precision fp32";
  // An encoder under --precision fp16 runs in fp16 too: an activation past 65504 ends as this.
  else if (fp16_) what += " (under --precision fp16 an encoder's activations are fp16, past 65504 infinite: "
                          "extract it with --precision fp32)";
  return BadInput(slide_name_ + ": tile " + std::to_string(rows_) + " (level-0 x " + std::to_string(coords[0]) +
                  ", y " + std::to_string(coords[1]) + "): feature " + std::to_string(column) + " is " + what +
                  "; a feature file holds finite values only, so " + path_ + " is not written (the tiles before this "
                  "one stay in " + partial_ + ")");
}

void FeatureFileWriter::append(const float *features, const int64_t *coords, int64_t count) {
  if (count == 0) return;
  const std::span<const float> values(features, static_cast<size_t>(count * width_));
  // Converted here by to_half rather than by HDF5 (float16_type), and checked before written.
  std::vector<uint16_t> halves;
  if (fp16_) halves = to_half(values);
  const std::optional<size_t> refused = first_non_finite(values, halves);
  // The rows before a refused one are written, so that the partial file ends at it.
  const int64_t writable = refused ? static_cast<int64_t>(*refused) / width_ : count;
  const Hdf5Lock hdf5_lock;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // per thread: appends run on the writer thread
  auto write = [&](hid_t dataset, hsize_t columns, hid_t memory_type, const void *data, const char *name) {
    hsize_t dims[2] = {static_cast<hsize_t>(rows_ + writable), columns};
    hsize_t start[2] = {static_cast<hsize_t>(rows_), 0}, size[2] = {static_cast<hsize_t>(writable), columns};
    if (H5Dset_extent(dataset, dims) < 0) throw Error(ExitCode::runtime_error, disk_message(partial_, "extend"));
    Handle file_space(H5Dget_space(dataset), H5Sclose);
    H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start, nullptr, size, nullptr);
    Handle memory_space(H5Screate_simple(2, size, nullptr), H5Sclose);
    if (H5Dwrite(dataset, memory_type, memory_space, file_space, H5P_DEFAULT, data) < 0)
      throw Error(ExitCode::runtime_error, disk_message(partial_, std::string("write ") + name));
  };
  if (writable > 0) {
    if (fp16_) {
      Handle half(float16_type(), H5Tclose);  // the file's type: HDF5 copies the bits as they are
      write(features_, static_cast<hsize_t>(width_), half, halves.data(), "features");
    } else {
      write(features_, static_cast<hsize_t>(width_), H5T_NATIVE_FLOAT, features, "features");
    }
    write(coords_, 2, H5T_NATIVE_INT64, coords, "coords");
    if (H5Fflush(file_, H5F_SCOPE_GLOBAL) < 0) throw Error(ExitCode::runtime_error, disk_message(partial_, "flush"));
    rows_ += writable;
    record_rows();
  }
  if (refused)
    throw refusal(values[*refused], static_cast<int64_t>(*refused) % width_, coords + 2 * writable);
}

void FeatureFileWriter::finish() {
  const Hdf5Lock hdf5_lock;
  close();
  durable_rename(partial_, path_);
  std::error_code error;
  fs::remove(rows_path_, error);
}

FeatureFileTiles read_feature_tiles(const std::string &path) {
  const Hdf5Lock hdf5_lock;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  if (!fs::exists(path)) throw BadInput(path + ": no such file");
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) throw BadInput(path + ": not an HDF5 file (or truncated)");
  if (H5Lexists(file, "coords", H5P_DEFAULT) <= 0) throw BadInput(path + ": dataset coords is missing");
  Handle coords(H5Dopen2(file, "coords", H5P_DEFAULT), H5Dclose);
  int64_t rows = coords.valid() ? extent_rows(coords) : -1;
  if (rows < 0) throw BadInput(path + ": coords must be [N,2]");
  Handle space(H5Dget_space(coords), H5Sclose);
  hsize_t dims[2] = {0, 0};
  H5Sget_simple_extent_dims(space, dims, nullptr);
  if (dims[1] != 2) throw BadInput(path + ": coords must be [N,2], got [" + std::to_string(rows) + "," +
                                   std::to_string(dims[1]) + "]");
  FeatureFileTiles tiles;
  hdf5::held_elements(coords, path + ": dataset coords");
  tiles.coords.resize(static_cast<size_t>(rows) * 2);
  if (rows > 0 && H5Dread(coords, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, tiles.coords.data()) < 0)
    throw BadInput(path + ": dataset coords cannot be read (truncated or corrupt)");
  double downsample[2] = {1, 1};
  if (!hdf5::read_attribute(coords, "patch_size", H5T_NATIVE_INT64, 1, &tiles.patch_size) ||
      !hdf5::read_attribute(coords, "patch_level", H5T_NATIVE_INT64, 1, &tiles.patch_level) ||
      !hdf5::read_attribute(coords, "downsample", H5T_NATIVE_DOUBLE, 2, downsample))
    throw BadInput(path + ": coords lacks the attributes patch_size, patch_level and downsample [2]");
  if (tiles.patch_size < 1 || tiles.patch_level < 0 || !(downsample[0] > 0))
    throw BadInput(path + ": coords has patch_size " + std::to_string(tiles.patch_size) + ", patch_level " +
                   std::to_string(tiles.patch_level) + ", downsample " + std::to_string(downsample[0]));
  tiles.downsample = downsample[0];
  tiles.name = hdf5::read_string_attribute(coords, "name").value_or("");
  if (int64_t level_dim[2] = {0, 0}; hdf5::read_attribute(coords, "level_dim", H5T_NATIVE_INT64, 2, level_dim)) {
    tiles.level_width = level_dim[0];
    tiles.level_height = level_dim[1];
  }
  return tiles;
}

std::string feature_file_encoder(const std::string &path) {
  const Hdf5Lock hdf5_lock;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.valid() || H5Lexists(file, "features", H5P_DEFAULT) <= 0) return "";
  Handle features(H5Dopen2(file, "features", H5P_DEFAULT), H5Dclose);
  return features.valid() ? hdf5::read_string_attribute(features, "encoder").value_or("") : "";
}

}  // namespace tessera
