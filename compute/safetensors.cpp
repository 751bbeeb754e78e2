#include "compute/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/json_input.h"

namespace tessera {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian, read as it lies");

namespace {

// Headers of real weights are well under 10 MB (a few hundred bytes a tensor; UNI2-h's is 60 KB);
// safetensors' own bound is 100 MB. 64 MiB refuses what no model writes before it is read.
constexpr uint64_t kMaxHeaderBytes = 64ull << 20;
// JSON values in a header: about ten a tensor, so 2^20 is 100000 tensors, 40 times a 70B
// language model's. It keeps the parsed header to a few hundred MB whatever the bytes hold.
constexpr uint64_t kMaxHeaderValues = 1ull << 20;
// Dimensions of a tensor: weights have at most 5 (a 3D convolution's).
constexpr size_t kMaxDimensions = 16;
// Problems listed in one refusal; the rest are counted.
constexpr size_t kProblemsShown = 20;

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
  // Both before the header is allocated.
  if (header_bytes > kMaxHeaderBytes)
    fail("a header of " + std::to_string(header_bytes) + " bytes (at most " + std::to_string(kMaxHeaderBytes) + ")");
  if (header_bytes > size - 8)
    fail("the header is said to hold " + std::to_string(header_bytes) + " bytes, but the file has " +
         std::to_string(size - 8) + " after the length (truncated?)");
  std::string text(header_bytes, '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(header_bytes))) fail("cannot read the header");
  // A tensor named twice is a duplicate key, refused here (nlohmann would keep the last).
  const nlohmann::json header =
      parse_json_input(text, path_ + ": not a valid .safetensors file: the header", {.max_values = kMaxHeaderValues});
  text = std::string();
  if (!header.is_object()) fail("the header is not a JSON object");
  data_offset_ = 8 + header_bytes;
  const uint64_t data_bytes = size - data_offset_;
  for (auto& [name, value] : header.items()) {
    if (name == "__metadata__") continue;
    auto bad = [&](const std::string& problem) { fail("tensor '" + quoted_excerpt(name) + "' " + problem); };
    if (!value.is_object() || !value.contains("dtype") || !value["dtype"].is_string() || !value.contains("shape") ||
        !value["shape"].is_array() || !value.contains("data_offsets") || !value["data_offsets"].is_array() ||
        value["data_offsets"].size() != 2)
      bad("needs a dtype, a shape and two data_offsets, got " + json_excerpt(value));
    Entry entry{name, value["dtype"].get<std::string>(), {}, 0, 0};
    // The element count, each step checked: a shape whose product passes 2^64 must not wrap to
    // one that matches the byte range.
    uint64_t count = 1;
    if (value["shape"].size() > kMaxDimensions)
      bad("has " + std::to_string(value["shape"].size()) + " dimensions (at most " + std::to_string(kMaxDimensions) +
          ")");
    for (auto& extent : value["shape"]) {
      if (!extent.is_number_unsigned() || extent.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        bad("has shape " + json_excerpt(value["shape"]) + " (extents are whole numbers below 2^63)");
      entry.shape.push_back(extent.get<int64_t>());
      if (__builtin_mul_overflow(count, extent.get<uint64_t>(), &count))
        bad("has shape " + json_excerpt(value["shape"]) + ", more than 2^64 values");
    }
    for (auto& offset : value["data_offsets"])
      if (!offset.is_number_unsigned()) bad("has data_offsets " + json_excerpt(value["data_offsets"]));
    entry.begin = value["data_offsets"][0].get<uint64_t>();
    entry.end = value["data_offsets"][1].get<uint64_t>();
    if (entry.begin > entry.end || entry.end > data_bytes)
      bad("lies at bytes [" + std::to_string(entry.begin) + ", " + std::to_string(entry.end) +
          ") of data, but the file holds " + std::to_string(data_bytes) + " bytes of data (truncated?)");
    uint64_t needed = 0;
    if (size_t item = dtype_size(entry.dtype); item != 0) {
      const bool overflows = __builtin_mul_overflow(count, item, &needed);
      if (overflows || entry.end - entry.begin != needed)
        bad("holds " + std::to_string(entry.end - entry.begin) + " bytes, but " + std::to_string(count) + " " +
            entry.dtype + " values of shape " + shape_text(entry.shape) + " take " +
            (overflows ? "more than 2^64" : std::to_string(needed)));
    }
    entries_.push_back(std::move(entry));
  }
  // Two tensors sharing bytes would be a lying header.
  std::vector<const Entry*> by_offset;
  for (auto& entry : entries_) by_offset.push_back(&entry);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  const Entry* reaching = nullptr;  // of the tensors before, the one that ends last
  for (const Entry* entry : by_offset) {
    if (entry->begin == entry->end) continue;  // empty: holds no bytes to share
    if (reaching && entry->begin < reaching->end)
      fail("tensors '" + quoted_excerpt(reaching->name) + "' and '" + quoted_excerpt(entry->name) + "' overlap");
    if (!reaching || entry->end > reaching->end) reaching = entry;
  }
}

std::vector<float> SafetensorsFile::read(const Entry& entry) const {
  const size_t item = dtype_size(entry.dtype);
  if (item == 0)
    throw BadInput(path_ + ": tensor '" + quoted_excerpt(entry.name) + "' has dtype " + quoted_excerpt(entry.dtype) +
                   " (tessera reads F32, F16, BF16)");
  std::vector<char> bytes(entry.end - entry.begin);
  std::ifstream in(path_, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(data_offset_ + entry.begin));
  if (!in.read(bytes.data(), static_cast<std::streamsize>(bytes.size())))
    throw BadInput(path_ + ": cannot read tensor '" + quoted_excerpt(entry.name) + "' (the file changed while read?)");
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
  refuse_non_finite(values, tensor_in(*this, entry));
  return values;
}

std::string tensor_in(const SafetensorsFile& file, const SafetensorsFile::Entry& entry) {
  return file.path() + ": tensor '" + quoted_excerpt(entry.name) + "' (" + quoted_excerpt(entry.dtype) + ")";
}

namespace {

// The file's tensors that make up one network tensor, in order along its first dimension.
using Pieces = std::vector<const SafetensorsFile::Entry*>;

// Each parameter and state tensor of `network` with the file's tensors of its name; throws
// BadInput naming every missing, unexpected, misshapen or unreadable tensor.
std::vector<std::pair<Network::Named, Pieces>> match_tensors(const SafetensorsFile& file, Network& network,
                                                              const ParameterRename& rename) {
  const std::string& path = file.path();
  std::map<std::string, Pieces> given;
  std::vector<std::string> problems;
  for (auto& entry : file.entries()) {
    ParameterPiece target = rename(entry.name);
    if (target.name.empty()) continue;
    Pieces& pieces = given[target.name];
    pieces.resize(static_cast<size_t>(target.pieces));
    auto& slot = pieces[static_cast<size_t>(target.piece)];
    if (slot)
      problems.push_back("tensors '" + quoted_excerpt(slot->name) + "' and '" + quoted_excerpt(entry.name) +
                         "' both name '" + quoted_excerpt(target.name) + "'");
    else
      slot = &entry;
  }
  auto shown = [](const SafetensorsFile::Entry& entry, const std::string& name) {
    return "'" + quoted_excerpt(entry.name) + "'" + (entry.name == name ? "" : " ('" + quoted_excerpt(name) + "')");
  };
  std::vector<std::pair<Network::Named, Pieces>> loads;
  std::map<std::string, bool> needed;
  for (auto& named : network.named_tensors()) {
    needed[named.name] = true;
    auto it = given.find(named.name);
    if (it == given.end()) {
      problems.push_back("missing tensor '" + named.name + "' " + to_string(named.spec.shape));
      continue;
    }
    const Pieces& pieces = it->second;
    // Each piece holds an equal share of the first dimension.
    Shape piece_shape = named.spec.shape;
    const auto count = static_cast<int64_t>(pieces.size());
    bool fits = !piece_shape.empty() && piece_shape[0] % count == 0;
    if (fits) piece_shape[0] /= count;
    size_t problems_before = problems.size();
    for (const SafetensorsFile::Entry* entry : pieces) {
      if (!entry) {
        problems.push_back("tensor '" + named.name + "' lacks one of its " + std::to_string(count) +
                           " pieces (the query, key or value of a joined qkv?)");
        break;
      }
      if (!fits || entry->shape != piece_shape)
        problems.push_back("tensor " + shown(*entry, named.name) + " has shape " + to_string(entry->shape) +
                           ", the model needs " + to_string(named.spec.shape) +
                           (count > 1 ? " in " + std::to_string(count) + " pieces of " + to_string(piece_shape) : ""));
      else if (dtype_size(entry->dtype) == 0)
        problems.push_back("tensor " + shown(*entry, named.name) + " has dtype " + quoted_excerpt(entry->dtype) +
                           " (tessera reads F32, F16, BF16)");
    }
    if (problems.size() == problems_before) loads.emplace_back(named, pieces);
  }
  for (auto& [name, pieces] : given)
    if (!needed.count(name))
      for (const SafetensorsFile::Entry* entry : pieces)
        if (entry) problems.push_back("unexpected tensor " + shown(*entry, name) + " " + to_string(entry->shape));
  if (!problems.empty()) {
    std::string text;
    for (size_t i = 0; i < std::min(problems.size(), kProblemsShown); ++i) text += "\n  " + problems[i];
    if (problems.size() > kProblemsShown)
      text += "\n  and " + std::to_string(problems.size() - kProblemsShown) + " more";
    auto name = network.description().find("name");
    throw BadInput(path + " does not fit the model" +
                   (name != network.description().end() && name->is_string() ? " " + quoted_excerpt(name->get_ref<const std::string&>()) : "") +
                   ":" + text);
  }
  return loads;
}

// The values of a tensor, its pieces joined along the first dimension.
std::vector<float> read_pieces(const SafetensorsFile& file, const Pieces& pieces) {
  if (pieces.size() == 1) return file.read(*pieces[0]);
  std::vector<float> values;
  for (const SafetensorsFile::Entry* entry : pieces) {
    std::vector<float> piece = file.read(*entry);
    values.insert(values.end(), piece.begin(), piece.end());
  }
  return values;
}

// How messages name a tensor of the file, or the pieces joined into one.
std::string pieces_in(const SafetensorsFile& file, const Pieces& pieces) {
  if (pieces.size() == 1) return tensor_in(file, *pieces[0]);
  std::string names;
  for (const SafetensorsFile::Entry* entry : pieces) names += (names.empty() ? "'" : ", '") + quoted_excerpt(entry->name) + "'";
  return file.path() + ": tensors " + names + " joined (" + quoted_excerpt(pieces[0]->dtype) + ")";
}

}  // namespace

void load_safetensors(const std::string& path, Network& network, const ParameterRename& rename) {
  SafetensorsFile file(path);
  // Read as the file holds them (F32, F16, BF16), converted once to the tensor's type.
  for (auto& [named, pieces] : match_tensors(file, network, rename))
    upload_weights(*named.tensor, read_pieces(file, pieces), pieces_in(file, pieces));
}

uint64_t check_safetensors(const std::string& path, Network& network, const ParameterRename& rename) {
  SafetensorsFile file(path);
  uint64_t values = 0;
  for (auto& [named, pieces] : match_tensors(file, network, rename)) {
    std::vector<float> read = read_pieces(file, pieces);
    refuse_unrepresentable(read, named.spec.dtype, pieces_in(file, pieces));
    values += read.size();
  }
  return values;
}

}  // namespace tessera
