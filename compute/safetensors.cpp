#include "compute/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace tessera {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian, read as it lies");

namespace {

// The format's own bound on the header (safetensors' MAX_HEADER_SIZE).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

size_t dtype_size(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  return 0;  // not a type tessera reads
}

std::string shape_text(const Shape& shape) { return to_string(shape); }

}  // namespace

bool is_safetensors_path(const std::string& path) { return std::filesystem::path(path).extension() == ".safetensors"; }

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  std::error_code error;
  const uint64_t size = std::filesystem::file_size(path_, error);
  if (error) throw BadInput(path_ + ": cannot read (" + error.message() + ")");
  auto fail = [&](const std::string& problem) {
    throw BadInput(path_ + ": not a valid .safetensors file: " + problem);
  };
  if (size < 8) fail("it holds " + std::to_string(size) + " bytes, fewer than the 8 of the header length");
  std::ifstream in(path_, std::ios::binary);
  unsigned char length_bytes[8];
  if (!in.read(reinterpret_cast<char*>(length_bytes), 8)) fail("cannot read the header length");
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = header_bytes << 8 | length_bytes[i];
  if (header_bytes > size - 8)
    fail("the header is said to hold " + std::to_string(header_bytes) + " bytes, but the file has " +
         std::to_string(size - 8) + " after the length (truncated?)");
  if (header_bytes > kMaxHeaderBytes) fail("a header of " + std::to_string(header_bytes) + " bytes (at most 100 MB)");
  std::string text(header_bytes, '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(header_bytes))) fail("cannot read the header");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail(std::string("the header is not JSON: ") + e.what());
  }
  if (!header.is_object()) fail("the header is not a JSON object");
  data_offset_ = 8 + header_bytes;
  const uint64_t data_bytes = size - data_offset_;
  for (auto& [name, value] : header.items()) {
    if (name == "__metadata__") continue;
    auto bad = [&](const std::string& problem) { fail("tensor '" + name + "' " + problem); };
    if (!value.is_object() || !value.contains("dtype") || !value["dtype"].is_string() || !value.contains("shape") ||
        !value["shape"].is_array() || !value.contains("data_offsets") || !value["data_offsets"].is_array() ||
        value["data_offsets"].size() != 2)
      bad("needs a dtype, a shape and two data_offsets, got " + value.dump());
    Entry entry{name, value["dtype"].get<std::string>(), {}, 0, 0};
    uint64_t count = 1;
    for (auto& extent : value["shape"]) {
      if (!extent.is_number_unsigned()) bad("has shape " + value["shape"].dump());
      entry.shape.push_back(extent.get<int64_t>());
      count *= extent.get<uint64_t>();
    }
    for (auto& offset : value["data_offsets"])
      if (!offset.is_number_unsigned()) bad("has data_offsets " + value["data_offsets"].dump());
    entry.begin = value["data_offsets"][0].get<uint64_t>();
    entry.end = value["data_offsets"][1].get<uint64_t>();
    if (entry.begin > entry.end || entry.end > data_bytes)
      bad("lies at bytes [" + std::to_string(entry.begin) + ", " + std::to_string(entry.end) +
          ") of data, but the file holds " + std::to_string(data_bytes) + " bytes of data (truncated?)");
    if (size_t item = dtype_size(entry.dtype); item != 0 && entry.end - entry.begin != count * item)
      bad("holds " + std::to_string(entry.end - entry.begin) + " bytes, but " + std::to_string(count) + " " +
          entry.dtype + " values of shape " + shape_text(entry.shape) + " take " + std::to_string(count * item));
    entries_.push_back(std::move(entry));
  }
  // Two tensors sharing bytes would be a lying header.
  std::vector<const Entry*> by_offset;
  for (auto& entry : entries_) by_offset.push_back(&entry);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i]->begin < by_offset[i - 1]->end && by_offset[i]->begin != by_offset[i]->end)
      fail("tensors '" + by_offset[i - 1]->name + "' and '" + by_offset[i]->name + "' overlap");
}

std::vector<float> SafetensorsFile::read(const Entry& entry) const {
  const size_t item = dtype_size(entry.dtype);
  if (item == 0)
    throw BadInput(path_ + ": tensor '" + entry.name + "' has dtype " + entry.dtype +
                   " (tessera reads F32, F16, BF16)");
  std::vector<char> bytes(entry.end - entry.begin);
  std::ifstream in(path_, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(data_offset_ + entry.begin));
  if (!in.read(bytes.data(), static_cast<std::streamsize>(bytes.size())))
    throw BadInput(path_ + ": cannot read tensor '" + entry.name + "' (the file changed while read?)");
  const size_t count = bytes.size() / item;
  std::vector<float> values(count);
  if (entry.dtype == "F32") {
    std::memcpy(values.data(), bytes.data(), bytes.size());
  } else if (entry.dtype == "F16") {
    std::vector<uint16_t> halves(count);
    std::memcpy(halves.data(), bytes.data(), bytes.size());
    values = from_half(halves);
  } else {  // BF16: the upper half of a float's bits
    for (size_t i = 0; i < count; ++i) {
      uint32_t bits = static_cast<uint32_t>(static_cast<unsigned char>(bytes[2 * i])) << 16 |
                      static_cast<uint32_t>(static_cast<unsigned char>(bytes[2 * i + 1])) << 24;
      std::memcpy(&values[i], &bits, 4);
    }
  }
  return values;
}

void load_safetensors(const std::string& path, Network& network,
                      const std::function<std::string(const std::string&)>& rename) {
  SafetensorsFile file(path);
  std::map<std::string, const SafetensorsFile::Entry*> given;
  std::vector<std::string> problems;
  for (auto& entry : file.entries()) {
    std::string name = rename(entry.name);
    if (auto [it, fresh] = given.emplace(name, &entry); !fresh)
      problems.push_back("tensors '" + it->second->name + "' and '" + entry.name + "' both name '" + name + "'");
  }
  auto shown = [](const SafetensorsFile::Entry& entry, const std::string& name) {
    return "'" + entry.name + "'" + (entry.name == name ? "" : " ('" + name + "')");
  };
  std::vector<std::pair<Tensor*, const SafetensorsFile::Entry*>> loads;
  std::map<std::string, bool> needed;
  for (auto& named : network.named_tensors()) {
    needed[named.name] = true;
    auto it = given.find(named.name);
    if (it == given.end()) {
      problems.push_back("missing tensor '" + named.name + "' " + to_string(named.spec.shape));
      continue;
    }
    const SafetensorsFile::Entry& entry = *it->second;
    if (entry.shape != named.spec.shape)
      problems.push_back("tensor " + shown(entry, named.name) + " has shape " + to_string(entry.shape) +
                         ", the model needs " + to_string(named.spec.shape));
    else if (dtype_size(entry.dtype) == 0)
      problems.push_back("tensor " + shown(entry, named.name) + " has dtype " + entry.dtype +
                         " (tessera reads F32, F16, BF16)");
    else
      loads.emplace_back(named.tensor, &entry);
  }
  for (auto& [name, entry] : given)
    if (!needed.count(name))
      problems.push_back("unexpected tensor " + shown(*entry, name) + " " + to_string(entry->shape));
  if (!problems.empty()) {
    std::string text;
    for (auto& problem : problems) text += "\n  " + problem;
    throw BadInput(path + " does not fit the model " + network.description().value("name", std::string("")) + ":" +
                   text);
  }
  for (auto& [tensor, entry] : loads) tensor->upload(file.read(*entry));
}

}  // namespace tessera
