#include "compute/checkpoint.h"

#include <openssl/evp.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>

#include "common/error.h"
#include "common/files.h"
#include "common/hdf5_lock.h"
#include "common/json_input.h"
#include "compute/hdf5.h"

namespace tessera {

namespace {

using hdf5::Handle;
using hdf5::read_string_attribute;
using hdf5::write_string_attribute;

void write_arrays(hid_t file, const std::string& file_path, const std::string& group_name,
                  const std::map<std::string, HostArray>& arrays) {
  Handle link_properties(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(link_properties, 1);
  for (auto& [name, array] : arrays) {
    std::vector<hsize_t> dims(array.shape.begin(), array.shape.end());
    Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
    std::string path = group_name + "/" + name;
    Handle dataset(H5Dcreate2(file, path.c_str(), H5T_IEEE_F32LE, space, link_properties, H5P_DEFAULT, H5P_DEFAULT),
                   H5Dclose);
    if (!dataset.valid() || H5Dwrite(dataset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, array.values.data()) < 0)
      throw Error(ExitCode::runtime_error, file_path + ": cannot write dataset " + path + disk_full_hint());
  }
}

// What read_arrays's H5Ovisit callback fills, and the exception it caught: exceptions must not
// unwind through libhdf5's C frames, so the callback stops the visit and read_arrays rethrows.
struct ArrayVisit {
  std::map<std::string, HostArray>* arrays;
  const std::string* path;
  const std::string* group;
  std::exception_ptr failure;
};

// A numeric dataset as float32, its size checked against the bytes the file holds; `what`
// names it in errors ("f.h5: dataset params/fc.weight").
HostArray read_float_dataset(hid_t dataset, const std::string& what) {
  Handle type(H5Dget_type(dataset), H5Tclose);
  H5T_class_t type_class = type.valid() ? H5Tget_class(type) : H5T_NO_CLASS;
  if (type_class != H5T_FLOAT && type_class != H5T_INTEGER)
    throw BadInput(what + " does not hold numbers (HDF5 type class " + std::to_string(type_class) + ")");
  uint64_t count = hdf5::held_elements(dataset, what);
  Handle space(H5Dget_space(dataset), H5Sclose);
  int rank = H5Sget_simple_extent_ndims(space);
  std::vector<hsize_t> dims(static_cast<size_t>(std::max(rank, 0)));
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  HostArray array;
  for (auto d : dims) array.shape.push_back(static_cast<int64_t>(d));
  try {
    array.values.resize(count);
  } catch (const std::bad_alloc&) {
    throw BadInput(what + ": " + std::to_string(count) + " values do not fit in memory");
  }
  if (count > 0 && H5Dread(dataset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, array.values.data()) < 0)
    throw BadInput(what + " cannot be read (truncated or corrupt)");
  return array;
}

void read_dataset(hid_t root, const char* name, ArrayVisit& v) {
  Handle dataset(H5Dopen2(root, name, H5P_DEFAULT), H5Dclose);
  std::string what = *v.path + ": dataset " + *v.group + "/" + name;
  if (!dataset.valid()) throw BadInput(what + " cannot be opened (corrupt)");
  HostArray& array = (*v.arrays)[name] = read_float_dataset(dataset, what);
  // Weights and optimizer state as tessera writes them are finite (a run that diverges writes
  // none); one NaN would make every output NaN.
  refuse_non_finite(array.values, what);
}

void read_arrays(hid_t file, const std::string& path, const std::string& group_name,
                 std::map<std::string, HostArray>& arrays) {
  if (group_name != "/" && H5Lexists(file, group_name.c_str(), H5P_DEFAULT) <= 0) return;
  Handle group(H5Gopen2(file, group_name.c_str(), H5P_DEFAULT), H5Gclose);
  // Datasets may sit in nested groups (h5py writes "a/b" as groups); visit them all.
  ArrayVisit visit{&arrays, &path, &group_name, nullptr};
  auto callback = [](hid_t root, const char* name, const H5O_info_t* info, void* data) -> herr_t {
    auto& v = *static_cast<ArrayVisit*>(data);
    if (info->type != H5O_TYPE_DATASET) return 0;
    try {
      read_dataset(root, name, v);
    } catch (...) {
      v.failure = std::current_exception();
      return -1;
    }
    return 0;
  };
  herr_t visited = H5Ovisit(group, H5_INDEX_NAME, H5_ITER_INC, callback, &visit);
  if (visit.failure) std::rethrow_exception(visit.failure);
  if (visited < 0) throw BadInput(path + ": group " + group_name + " cannot be read");
}

// Writes a new HDF5 file PATH.partial with `write`, then renames it over PATH durably; on any
// failure removes PATH.partial (a full disk keeps the old PATH and no large leftover).
void write_then_rename(const std::string& path, const std::function<void(hid_t, const std::string&)>& write) {
  const Hdf5Lock hdf5_lock;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  std::string partial = path + ".partial";
  try {
    {
      Handle file(hdf5::create_file(partial), H5Fclose);
      write(file, partial);
      if (H5Fflush(file, H5F_SCOPE_GLOBAL) < 0)
        throw Error(ExitCode::runtime_error, partial + ": cannot flush" + disk_full_hint());
    }
    durable_rename(partial, path);
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(partial, ignored);
    throw;
  }
}

}  // namespace

HostArray read_hdf5_array(const std::string& path, const std::string& dataset) {
  const Hdf5Lock hdf5_lock;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  if (!std::filesystem::exists(path)) throw BadInput(path + ": no such file");
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) throw BadInput(path + ": not an HDF5 file (or truncated)");
  if (H5Lexists(file, dataset.c_str(), H5P_DEFAULT) <= 0) throw BadInput(path + ": dataset " + dataset + " is missing");
  H5O_info_t info{};
  if (H5Oget_info_by_name(file, dataset.c_str(), &info, H5P_DEFAULT) < 0 || info.type != H5O_TYPE_DATASET)
    throw BadInput(path + ": " + dataset + " is not a dataset (a group, or corrupt)");
  Handle opened(H5Dopen2(file, dataset.c_str(), H5P_DEFAULT), H5Dclose);
  if (!opened.valid()) throw BadInput(path + ": dataset " + dataset + " cannot be opened (corrupt)");
  return read_float_dataset(opened, path + ": dataset " + dataset);
}

void write_hdf5_arrays(const std::string& path, const std::map<std::string, HostArray>& arrays) {
  const Hdf5Lock hdf5_lock;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  write_then_rename(path, [&](hid_t file, const std::string& partial) { write_arrays(file, partial, "", arrays); });
}

namespace {
HostArray download_array(const Tensor& tensor) {
  HostArray array{tensor.shape(), {}};
  if (tensor.dtype() == DType::u32) {
    std::vector<uint32_t> words(static_cast<size_t>(tensor.count()));
    tensor.download(words.data(), words.size() * 4);
    array.values.assign(words.begin(), words.end());
  } else {
    array.values = tensor.download();
  }
  return array;
}
}  // namespace

std::map<std::string, HostArray> download_tensors(const std::map<std::string, Tensor*>& tensors) {
  std::map<std::string, HostArray> arrays;
  for (auto& [name, tensor] : tensors) arrays[name] = download_array(*tensor);
  return arrays;
}

std::string weights_digest(const std::map<std::string, Tensor*>& tensors) {
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> context(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!context || EVP_DigestInit_ex(context.get(), EVP_sha256(), nullptr) != 1)
    throw Error(ExitCode::runtime_error, "cannot start a SHA-256 digest");
  // One tensor on the host at a time: a ViT-g's weights as float32 are 4.5 GB.
  for (auto& [name, tensor] : tensors) {
    HostArray array = download_array(*tensor);
    std::string header = name + to_string(array.shape);
    EVP_DigestUpdate(context.get(), header.c_str(), header.size() + 1);
    EVP_DigestUpdate(context.get(), array.values.data(), array.values.size() * sizeof(float));
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(context.get(), digest, &length);
  std::string text = "sha256:";
  for (unsigned int i = 0; i < length; ++i) {
    char hex[3];
    std::snprintf(hex, sizeof hex, "%02x", digest[i]);
    text += hex;
  }
  return text;
}

bool is_checkpoint_path(const std::string& path) {
  auto extension = std::filesystem::path(path).extension();
  return extension == ".h5" || extension == ".hdf5";
}

void write_checkpoint(const std::string& path, const Checkpoint& checkpoint) {
  write_then_rename(path, [&](hid_t file, const std::string& partial) {
    write_string_attribute(file, "model", checkpoint.model.dump());
    write_string_attribute(file, "format", "tessera-checkpoint-1");
    write_arrays(file, partial, "params", checkpoint.params);
    write_arrays(file, partial, "train", checkpoint.train);
    if (!checkpoint.progress.is_null()) {
      Handle link_properties(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
      if (H5Lexists(file, "train", H5P_DEFAULT) <= 0)
        Handle(H5Gcreate2(file, "train", link_properties, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
      Handle train(H5Gopen2(file, "train", H5P_DEFAULT), H5Gclose);
      write_string_attribute(train, "progress", checkpoint.progress.dump());
    }
  });
}

nlohmann::json read_checkpoint_progress(const std::string& path) {
  const Hdf5Lock hdf5_lock;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) throw BadInput(path + ": not an HDF5 file (or truncated)");
  if (H5Lexists(file, "train", H5P_DEFAULT) <= 0) return nullptr;
  Handle train(H5Gopen2(file, "train", H5P_DEFAULT), H5Gclose);
  auto progress = read_string_attribute(train, "progress");
  if (!progress) return nullptr;
  return parse_json_input(*progress, path + ": attribute train/progress");
}

namespace {

nlohmann::json read_model_attribute(hid_t file, const std::string& path) {
  auto model = read_string_attribute(file, "model");
  if (!model) throw BadInput(path + ": attribute 'model' (the model description) is missing");
  return parse_json_input(*model, path + ": attribute 'model'");
}

}  // namespace

nlohmann::json read_checkpoint_model(const std::string& path) {
  const Hdf5Lock hdf5_lock;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  if (!std::filesystem::exists(path)) throw BadInput(path + ": no such checkpoint file");
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) throw BadInput(path + ": not an HDF5 file (or truncated)");
  return read_model_attribute(file, path);
}

Checkpoint read_checkpoint(const std::string& path) {
  const Hdf5Lock hdf5_lock;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  if (!std::filesystem::exists(path)) throw BadInput(path + ": no such checkpoint file");
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) throw BadInput(path + ": not an HDF5 file (or truncated)");
  Checkpoint checkpoint;
  checkpoint.model = read_model_attribute(file, path);
  if (H5Lexists(file, "params", H5P_DEFAULT) <= 0) throw BadInput(path + ": group 'params' is missing");
  read_arrays(file, path, "params", checkpoint.params);
  read_arrays(file, path, "train", checkpoint.train);
  if (H5Lexists(file, "train", H5P_DEFAULT) > 0) {
    Handle train(H5Gopen2(file, "train", H5P_DEFAULT), H5Gclose);
    if (auto progress = read_string_attribute(train, "progress"))
      checkpoint.progress = parse_json_input(*progress, path + ": attribute train/progress");
  }
  return checkpoint;
}

void check_arrays_fit(const std::map<std::string, HostArray>& arrays, const std::map<std::string, Shape>& needed,
                      const std::string& file, const std::string& group) {
  for (auto& [name, shape] : needed) {
    auto it = arrays.find(name);
    if (it == arrays.end()) throw BadInput(file + ": dataset " + group + "/" + name + " is missing");
    if (element_count(it->second.shape) != element_count(shape) ||
        (it->second.shape != shape && it->second.shape.size() > 1))
      throw BadInput(file + ": dataset " + group + "/" + name + " has shape " + to_string(it->second.shape) +
                     ", the model needs " + to_string(shape));
  }
}

void load_tensors(const std::map<std::string, HostArray>& arrays, const std::map<std::string, Tensor*>& tensors,
                  const std::string& file, const std::string& group) {
  std::map<std::string, Shape> needed;
  for (auto& [name, tensor] : tensors) needed[name] = tensor->shape();
  check_arrays_fit(arrays, needed, file, group);
  for (auto& [name, tensor] : tensors) {
    auto it = arrays.find(name);
    if (tensor->dtype() == DType::u32) {
      std::vector<uint32_t> words(it->second.values.begin(), it->second.values.end());
      tensor->upload(words.data(), words.size() * 4);
    } else {
      upload_weights(*tensor, it->second.values, file + ": dataset " + group + "/" + name);
    }
  }
}

}  // namespace tessera
