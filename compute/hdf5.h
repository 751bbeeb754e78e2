// Small HDF5 helpers shared by checkpoints and feature files. Every HDF5 call holds Hdf5Lock
// (common/hdf5_lock.h): each public function here, in checkpoint.h and in feature_file.h takes it.
#pragma once
#include <hdf5.h>

#include <optional>
#include <string>
#include <vector>

#include "common/hdf5_lock.h"

namespace tessera::hdf5 {

// Closes an HDF5 handle with the function that fits it.
class Handle {
 public:
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~Handle() {
    const Hdf5Lock hdf5_lock;  // a handle may outlive the call that opened it
    if (id_ >= 0) close_(id_);
  }
  Handle(const Handle &) = delete;
  Handle &operator=(const Handle &) = delete;
  operator hid_t() const { return id_; }
  bool valid() const { return id_ >= 0; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

// Creates the HDF5 file `path` new for writing: made by create_new_file (common/output.h: a
// leftover or a link at `path` is removed, never followed), then opened by HDF5. Throws Error
// naming the file when it cannot be created, or when `path` changed in between.
hid_t create_file(const std::string &path);

// The element count of `dataset`, checked against the bytes the file holds for it: sizes come
// from the bytes, not only from what the file declares. A dataset that declares more than its
// storage can hold (with compression, a thousand times and more its stored bytes) is BadInput
// naming `what` ("f.h5: dataset features").
uint64_t held_elements(hid_t dataset, const std::string &what);

void write_string_attribute(hid_t object, const char *name, const std::string &value);
// The attribute's text, or nothing when it is missing or not a string.
std::optional<std::string> read_string_attribute(hid_t object, const char *name);

// A numeric attribute of `dims` (empty: a scalar) read from `data` as
// `memory_type`.
void write_attribute(hid_t object, const char *name, hid_t memory_type, const std::vector<hsize_t> &dims,
                     const void *data);

// Reads a numeric attribute of `count` elements as `memory_type` into `data`; false when it
// is missing, not numeric or of another size.
bool read_attribute(hid_t object, const char *name, hid_t memory_type, size_t count, void *data);

}  // namespace tessera::hdf5
