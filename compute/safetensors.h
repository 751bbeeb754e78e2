// Weights as users download them: the .safetensors format (Hugging Face's: an 8-byte
// little-endian header length, a JSON header giving each tensor's dtype, shape and byte range,
// then the raw little-endian data), read directly. Every size is checked against the bytes the
// file really holds before anything is read.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "compute/network.h"

namespace tessera {

class SafetensorsFile {
 public:
  struct Entry {
    std::string name;
    std::string dtype;  // "F32", "F16", "BF16" (read); any other is listed but refused on read
    Shape shape;
    uint64_t begin = 0, end = 0;  // byte range within the data
  };
  // Parses and checks the header; throws BadInput naming the file and the problem.
  explicit SafetensorsFile(std::string path);
  const std::string& path() const { return path_; }
  const std::vector<Entry>& entries() const { return entries_; }
  // The values of one tensor, converted to float.
  std::vector<float> read(const Entry& entry) const;

 private:
  std::string path_;
  uint64_t data_offset_ = 0;
  std::vector<Entry> entries_;
};

// Where a file's tensor goes in the network: the parameter it names, and which of `pieces` equal
// slices along the first dimension it is, for parameters a publisher stores in pieces (Hugging
// Face's query, key and value of one qkv). An empty name: a tensor the publisher ships that
// inference never reads (a pre-training mask token), skipped.
struct ParameterPiece {
  std::string name;
  int piece = 0, pieces = 1;
};
using ParameterRename = std::function<ParameterPiece(const std::string&)>;

// "FILE: tensor 'NAME' (DTYPE)", as messages name a tensor of the file.
std::string tensor_in(const SafetensorsFile& file, const SafetensorsFile::Entry& entry);

// Loads every parameter and state tensor of `network` from the .safetensors file at `path`,
// its names mapped through `rename` (a publisher's to timm's: compute/vit.h), each converted
// once to its tensor's type (fp16 weights: one past 65504 is refused by name). All names,
// shapes and dtypes are checked before any value is read; every missing, unexpected,
// misshapen or unreadable tensor is named in one BadInput (exit 5), and nothing is loaded.
void load_safetensors(const std::string& path, Network& network, const ParameterRename& rename);
// The same checks, and every value read and checked finite on the host, without loading
// anything (the network need not be allocated): `tessera doctor`. Returns the values read.
uint64_t check_safetensors(const std::string& path, Network& network, const ParameterRename& rename);

bool is_safetensors_path(const std::string& path);

}  // namespace tessera
