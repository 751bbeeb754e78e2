#include "compute/hdf5.h"

#include "common/error.h"
#include "common/hdf5_lock.h"

namespace tessera::hdf5 {

namespace {
// A file whose close failed (a full disk) stays in libhdf5's tables, and the library's atexit
// cleanup then crashes closing it again; tessera closes every file itself, so it skips that
// cleanup (set before main, ahead of any other HDF5 call).
[[maybe_unused]] const bool no_cleanup_at_exit = [] { return H5dont_atexit() >= 0; }();
}  // namespace

// Variable-length UTF-8, as h5py writes a Python str (and reads it back as str, not bytes).
void write_string_attribute(hid_t object, const char *name, const std::string &value) {
  const Hdf5Lock hdf5_lock;
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type, H5T_VARIABLE);
  H5Tset_cset(type, H5T_CSET_UTF8);
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attribute(H5Acreate2(object, name, type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  const char *text = value.c_str();
  if (!attribute.valid() || H5Awrite(attribute, type, &text) < 0)
    throw Error(ExitCode::runtime_error, std::string("cannot write HDF5 attribute ") + name);
}

std::optional<std::string> read_string_attribute(hid_t object, const char *name) {
  const Hdf5Lock hdf5_lock;
  if (H5Aexists(object, name) <= 0) return std::nullopt;
  Handle attribute(H5Aopen(object, name, H5P_DEFAULT), H5Aclose);
  Handle type(H5Aget_type(attribute), H5Tclose);
  if (H5Tget_class(type) != H5T_STRING) return std::nullopt;
  if (H5Tis_variable_str(type) > 0) {
    char *text = nullptr;
    Handle memory(H5Tget_native_type(type, H5T_DIR_ASCEND), H5Tclose);
    if (H5Aread(attribute, memory, &text) < 0 || !text) return std::nullopt;
    std::string value(text);
    H5free_memory(text);
    return value;
  }
  std::string value(H5Tget_size(type), '\0');
  if (H5Aread(attribute, type, value.data()) < 0) return std::nullopt;
  value.resize(value.find('\0') == std::string::npos ? value.size() : value.find('\0'));
  return value;
}

void write_attribute(hid_t object, const char *name, hid_t memory_type, const std::vector<hsize_t> &dims,
                     const void *data) {
  const Hdf5Lock hdf5_lock;
  Handle space(
      dims.empty() ? H5Screate(H5S_SCALAR) : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
      H5Sclose);
  Handle attribute(H5Acreate2(object, name, memory_type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attribute.valid() || H5Awrite(attribute, memory_type, data) < 0)
    throw Error(ExitCode::runtime_error, std::string("cannot write HDF5 attribute ") + name);
}

bool read_attribute(hid_t object, const char *name, hid_t memory_type, size_t count, void *data) {
  const Hdf5Lock hdf5_lock;
  if (H5Aexists(object, name) <= 0) return false;
  Handle attribute(H5Aopen(object, name, H5P_DEFAULT), H5Aclose);
  Handle type(H5Aget_type(attribute), H5Tclose);
  Handle space(H5Aget_space(attribute), H5Sclose);
  H5T_class_t type_class = H5Tget_class(type);
  if ((type_class != H5T_INTEGER && type_class != H5T_FLOAT) ||
      H5Sget_simple_extent_npoints(space) != static_cast<hssize_t>(count))
    return false;
  return H5Aread(attribute, memory_type, data) >= 0;
}

}  // namespace tessera::hdf5
