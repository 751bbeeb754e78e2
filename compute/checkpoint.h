// Checkpoints in HDF5 with PyTorch's parameter names and layouts (docs/architecture.md, "Formats"):
// root attribute `model` (JSON), `params/<name>` float32 datasets, and under `train/` the
// optimizer state, the step counter and where the run stood.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compute/tensor.h"

namespace tessera {

struct HostArray {
  Shape shape;
  std::vector<float> values;
};

struct Checkpoint {
  nlohmann::json model;                          // the model description
  std::map<std::string, HostArray> params;       // "conv1.weight" -> values
  std::map<std::string, HostArray> train;        // "optimizer/conv1.weight.exp_avg", "step" ...
  nlohmann::json progress;                       // epoch, flags of the run (train/ attribute)
};

// Writes to PATH.partial and renames it over PATH: a killed run leaves the last whole checkpoint.
void write_checkpoint(const std::string& path, const Checkpoint& checkpoint);
// Throws BadInput naming the file and the dataset that is missing or malformed.
Checkpoint read_checkpoint(const std::string& path);
// The progress record alone (epoch, settings of the run), without the arrays; null when the
// checkpoint has none.
nlohmann::json read_checkpoint_progress(const std::string& path);
// The model description alone; throws BadInput naming the file as read_checkpoint does.
nlohmann::json read_checkpoint_model(const std::string& path);

// Whether `arrays` holds every name of `needed` with its shape (a 1-D array of as many values
// as a tensor of another shape stands for it); throws BadInput naming the parameter (and the
// file) on a missing name or a shape mismatch.
void check_arrays_fit(const std::map<std::string, HostArray>& arrays, const std::map<std::string, Shape>& needed,
                      const std::string& file, const std::string& group);

// Copies parameter and state values into device tensors by name, checking shapes; throws
// BadInput naming the parameter (and the file) on a missing name or a shape mismatch.
void load_tensors(const std::map<std::string, HostArray>& arrays, const std::map<std::string, Tensor*>& tensors,
                  const std::string& file, const std::string& group);

// Copies device tensors to host arrays by name (u32 tensors as whole-number floats), for
// write_checkpoint.
std::map<std::string, HostArray> download_tensors(const std::map<std::string, Tensor*>& tensors);

bool is_checkpoint_path(const std::string& path);

// "sha256:<hex>" of the tensors' names, shapes and float32 values in name order: the identity of
// a model's weights that feature files record. Downloads one tensor at a time.
std::string weights_digest(const std::map<std::string, Tensor*>& tensors);

// Plain float32 arrays in an HDF5 file (inputs and outputs of `tessera forward`).
HostArray read_hdf5_array(const std::string& path, const std::string& dataset);
void write_hdf5_arrays(const std::string& path, const std::map<std::string, HostArray>& arrays);

}  // namespace tessera
