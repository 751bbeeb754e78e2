#include "data/patch_coords.h"

#include <hdf5.h>

#include <cmath>
#include <filesystem>

#include "common/checked.h"
#include "common/error.h"
#include "common/hdf5_lock.h"
#include "data/tile_format.h"

namespace tessera::data {

namespace {

namespace fs = std::filesystem;

constexpr hsize_t max_patches = hsize_t{1} << 28;  // 268M patches: more than any slide holds

// One open HDF5 object, closed with its own function.
struct Handle {
  hid_t id = -1;
  herr_t (*close)(hid_t) = nullptr;
  ~Handle() {
    if (id >= 0) close(id);
  }
};

// A scalar numeric attribute of `object` as a double (HDF5 converts integers), if present.
std::optional<double> number_attribute(hid_t object, const char* name, const std::string& file) {
  if (H5Aexists(object, name) <= 0) return std::nullopt;
  Handle attribute{H5Aopen(object, name, H5P_DEFAULT), H5Aclose};
  Handle space{H5Aget_space(attribute.id), H5Sclose};
  Handle type{H5Aget_type(attribute.id), H5Tclose};
  H5T_class_t kind = H5Tget_class(type.id);
  if (attribute.id < 0 || H5Sget_simple_extent_npoints(space.id) != 1 || (kind != H5T_INTEGER && kind != H5T_FLOAT))
    throw BadInput(file + ": coords attribute " + name + " is not a number");
  double value = 0;
  if (H5Aread(attribute.id, H5T_NATIVE_DOUBLE, &value) < 0 || !std::isfinite(value))
    throw BadInput(file + ": coords attribute " + name + " cannot be read as a number");
  return value;
}

// A pair of numbers (CLAM's level_dim), if present.
std::optional<std::pair<double, double>> pair_attribute(hid_t object, const char* name, const std::string& file) {
  if (H5Aexists(object, name) <= 0) return std::nullopt;
  Handle attribute{H5Aopen(object, name, H5P_DEFAULT), H5Aclose};
  Handle space{H5Aget_space(attribute.id), H5Sclose};
  double values[2] = {0, 0};
  if (attribute.id < 0 || H5Sget_simple_extent_npoints(space.id) != 2 ||
      H5Aread(attribute.id, H5T_NATIVE_DOUBLE, values) < 0)
    throw BadInput(file + ": coords attribute " + name + " is not a pair of numbers");
  return std::pair{values[0], values[1]};
}

std::string string_attribute(hid_t object, const char* name) {
  if (H5Aexists(object, name) <= 0) return {};
  Handle attribute{H5Aopen(object, name, H5P_DEFAULT), H5Aclose};
  Handle type{H5Aget_type(attribute.id), H5Tclose};
  if (attribute.id < 0 || H5Tget_class(type.id) != H5T_STRING) return {};
  if (H5Tis_variable_str(type.id) > 0) {
    Handle memory{H5Tget_native_type(type.id, H5T_DIR_ASCEND), H5Tclose};
    char* text = nullptr;
    if (H5Aread(attribute.id, memory.id, &text) < 0 || !text) return {};
    std::string value(text);
    Handle space{H5Aget_space(attribute.id), H5Sclose};
    H5Dvlen_reclaim(memory.id, space.id, H5P_DEFAULT, &text);
    return value;
  }
  std::string value(H5Tget_size(type.id), '\0');
  if (H5Aread(attribute.id, type.id, value.data()) < 0) return {};
  return value.substr(0, value.find('\0'));
}

// A whole number of pixels, 1 to 65535, from an attribute that may be stored as a float.
int64_t patch_side(double value, const char* name, const std::string& file) {
  if (!(value >= 1 && value <= max_tile_size) || std::abs(value - std::round(value)) > 1e-6)
    throw BadInput(file + ": coords attribute " + std::string(name) + " is " + std::to_string(value) +
                   ", not a whole number of pixels from 1 to 65535");
  return std::llround(value);
}

}  // namespace

PatchCoords read_patch_coords(const std::string& path) {
  const Hdf5Lock hdf5_lock;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  PatchCoords coords;
  coords.file = path;
  Handle file{H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
  if (file.id < 0) throw BadInput(path + ": cannot open as HDF5 (missing, unreadable or not an HDF5 file)");
  if (H5Lexists(file.id, "coords", H5P_DEFAULT) <= 0)
    throw BadInput(path + ": no `coords` dataset (not a CLAM or TRIDENT patch coordinates file)");
  Handle dataset{H5Dopen2(file.id, "coords", H5P_DEFAULT), H5Dclose};
  Handle space{H5Dget_space(dataset.id), H5Sclose};
  Handle type{H5Dget_type(dataset.id), H5Tclose};
  hsize_t dims[2] = {0, 0};
  if (dataset.id < 0 || H5Sget_simple_extent_ndims(space.id) != 2 || H5Tget_class(type.id) != H5T_INTEGER)
    throw BadInput(path + ": coords must be integers [N,2] (each patch's level-0 x, y)");
  H5Sget_simple_extent_dims(space.id, dims, nullptr);
  if (dims[1] != 2) throw BadInput(path + ": coords must be [N,2], not [" + std::to_string(dims[0]) + "," +
                                   std::to_string(dims[1]) + "]");
  if (dims[0] > max_patches) throw BadInput(path + ": coords declares " + std::to_string(dims[0]) + " patches");
  // Every chunk of the rows it declares must be backed by data (a file cut short says otherwise).
  if (dims[0] > 0 && H5Dget_storage_size(dataset.id) == 0)
    throw BadInput(path + ": coords declares " + std::to_string(dims[0]) + " patches but holds no data");
  std::vector<int64_t> values(dims[0] * 2);
  if (dims[0] > 0 && H5Dread(dataset.id, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) < 0)
    throw BadInput(path + ": coords cannot be read (a truncated or corrupt file)");
  coords.origins.reserve(dims[0]);
  for (size_t row = 0; row < dims[0]; ++row) {
    if (values[2 * row] < 0 || values[2 * row + 1] < 0)
      throw BadInput(path + ": coords row " + std::to_string(row) + " is (" + std::to_string(values[2 * row]) + ", " +
                     std::to_string(values[2 * row + 1]) + "), outside every slide");
    coords.origins.push_back({values[2 * row], values[2 * row + 1]});
  }
  std::optional<double> size = number_attribute(dataset.id, "patch_size", path);
  if (!size) throw BadInput(path + ": coords has no patch_size attribute (CLAM and TRIDENT write it)");
  coords.patch_size = patch_side(*size, "patch_size", path);
  coords.name = string_attribute(dataset.id, "name");
  if (std::optional<double> level0 = number_attribute(dataset.id, "patch_size_level0", path)) {
    coords.layout = "trident";
    coords.patch_size_level0 = static_cast<double>(patch_side(*level0, "patch_size_level0", path));
    std::optional<double> width = number_attribute(dataset.id, "level0_width", path);
    std::optional<double> height = number_attribute(dataset.id, "level0_height", path);
    coords.level0_width = width ? rounded<int64_t>(*width, Field(path, "coords attribute level0_width"), 0) : 0;
    coords.level0_height = height ? rounded<int64_t>(*height, Field(path, "coords attribute level0_height"), 0) : 0;
    for (auto [name, value] : {std::pair{"level0_magnification", &coords.level0_magnification},
                               {"target_magnification", &coords.target_magnification}})
      if (std::optional<double> magnification = number_attribute(dataset.id, name, path)) {
        if (!(*magnification > 0 && *magnification <= 1000))
          throw BadInput(path + ": coords attribute " + name + " is " + std::to_string(*magnification) +
                         ", not a magnification (above 0, at most 1000)");
        *value = *magnification;
      }
    return coords;
  }
  coords.layout = "clam";
  std::optional<double> level = number_attribute(dataset.id, "patch_level", path);
  if (!level) throw BadInput(path + ": coords has neither patch_size_level0 (TRIDENT) nor patch_level (CLAM)");
  if (*level < 0 || *level > 255 || *level != std::round(*level))
    throw BadInput(path + ": coords attribute patch_level is " + std::to_string(*level) + ", not a level");
  coords.patch_level = std::llround(*level);
  // CLAM's level_dim is the size of patch_level; at level 0 that is the slide's.
  if (auto dim = pair_attribute(dataset.id, "level_dim", path); dim && coords.patch_level == 0) {
    coords.level0_width = rounded<int64_t>(dim->first, Field(path, "coords attribute level_dim"), 0);
    coords.level0_height = rounded<int64_t>(dim->second, Field(path, "coords attribute level_dim"), 0);
  }
  return coords;
}

double PatchCoords::extent(const Slide& slide) const {
  if (patch_size_level0 > 0) return patch_size_level0;
  if (static_cast<size_t>(patch_level) >= slide.levels().size())
    throw BadInput(file + ": coords patch_level " + std::to_string(patch_level) + " is not a level of " +
                   slide.path() + " (levels 0 to " + std::to_string(slide.levels().size() - 1) + ")");
  return static_cast<double>(patch_size) * slide.levels()[static_cast<size_t>(patch_level)].downsample;
}

void PatchCoords::check_fits(const Slide& slide, const std::string& slide_path) const {
  const std::string stem = fs::path(slide_path).stem().string();
  // TRIDENT and CLAM name the slide by its file name without the extension.
  if (!name.empty() && name != stem && name != fs::path(slide_path).filename().string())
    throw BadInput(file + ": the coordinates of slide '" + name + "', not of " + slide_path);
  const SlideLevel& base = slide.levels()[0];
  if ((level0_width && level0_width != base.width) || (level0_height && level0_height != base.height))
    throw BadInput(file + ": made for a slide of " + std::to_string(level0_width) + "x" +
                   std::to_string(level0_height) + " pixels; " + slide_path + " is " + std::to_string(base.width) +
                   "x" + std::to_string(base.height) + ": the coordinates of another slide?");
  extent(slide);  // its patch_level is one of the slide's
  size_t outside = 0, first = 0;
  for (size_t row = 0; row < origins.size(); ++row)
    if (origins[row].x >= base.width || origins[row].y >= base.height) {
      if (outside == 0) first = row;
      ++outside;
    }
  if (outside)
    throw BadInput(file + ": " + std::to_string(outside) + " of its " + std::to_string(origins.size()) +
                   " patches lie outside " + slide_path + " (" + std::to_string(base.width) + "x" +
                   std::to_string(base.height) + "), the first row " + std::to_string(first) + " at (" +
                   std::to_string(origins[first].x) + ", " + std::to_string(origins[first].y) + ")");
}

std::string find_patch_coords(const std::string& directory, const std::string& stem) {
  std::vector<std::string> found;
  for (const fs::path& folder : {fs::path(directory), fs::path(directory) / "patches"})
    for (const std::string& name : {stem + "_patches.h5", stem + ".h5"})
      if (std::error_code error; fs::is_regular_file(folder / name, error)) found.push_back((folder / name).string());
  if (found.size() > 1)
    throw BadInput("--coords " + directory + ": both " + found[0] + " and " + found[1] + " are coordinates of " + stem);
  return found.empty() ? std::string() : found.front();
}

}  // namespace tessera::data
