#include "data/ome_xml.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <map>

#include "common/checked.h"
#include "common/error.h"
#include "common/utf8.h"

namespace tessera::data {

namespace {

constexpr int64_t max_side = int64_t{1} << 31;  // a slide side tessera reads (slide_record.h)

void append_code_point(std::string& out, uint32_t code) {
  if (code == 0 || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) code = 0xFFFD;
  if (code < 0x80) {
    out += static_cast<char>(code);
  } else if (code < 0x800) {
    out += static_cast<char>(0xC0 | (code >> 6));
    out += static_cast<char>(0x80 | (code & 0x3F));
  } else if (code < 0x10000) {
    out += static_cast<char>(0xE0 | (code >> 12));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (code >> 18));
    out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code & 0x3F));
  }
}

// XML's five named entities and numeric character references; others are left as written.
std::string decode_entities(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t at = 0; at < text.size(); ++at) {
    size_t end = text[at] == '&' ? text.find(';', at) : std::string_view::npos;
    if (end == std::string_view::npos || end - at > 12) {
      out += text[at];
      continue;
    }
    std::string_view name = text.substr(at + 1, end - at - 1);
    static constexpr std::array<std::pair<std::string_view, char>, 5> named{
        {{"lt", '<'}, {"gt", '>'}, {"amp", '&'}, {"quot", '"'}, {"apos", '\''}}};
    auto found = std::find_if(named.begin(), named.end(), [&](auto& entry) { return entry.first == name; });
    uint32_t code = 0;
    bool hex = name.size() > 1 && name[0] == '#' && (name[1] == 'x' || name[1] == 'X');
    std::string_view digits = name.substr(std::min<size_t>(name.size(), hex ? 2 : 1));
    if (found != named.end()) {
      out += found->second;
    } else if (!name.empty() && name[0] == '#' && !digits.empty() &&
               std::from_chars(digits.data(), digits.data() + digits.size(), code, hex ? 16 : 10).ptr ==
                   digits.data() + digits.size()) {
      append_code_point(out, code);
    } else {
      out += text[at];
      continue;
    }
    at = end;
  }
  return out;
}

// Where each start tag of `element` begins and ends (the index of its '>', or the end of `xml`),
// quoted attribute values skipped, so a '>' inside one does not end the tag.
std::vector<std::pair<size_t, size_t>> find_start_tags(const std::string& xml, const std::string& element,
                                                       size_t from = 0, size_t to = std::string::npos) {
  std::vector<std::pair<size_t, size_t>> tags;
  const std::string open = "<" + element;
  to = std::min(to, xml.size());
  for (size_t at = xml.find(open, from); at != std::string::npos && at < to; at = xml.find(open, at + 1)) {
    size_t after = at + open.size();
    char next = after < xml.size() ? xml[after] : '>';
    if (next != ' ' && next != '>' && next != '/' && next != '\n' && next != '\t' && next != '\r') continue;
    size_t end = after;
    for (char quote = 0; end < xml.size(); ++end) {
      if (quote) {
        if (xml[end] == quote) quote = 0;
      } else if (xml[end] == '"' || xml[end] == '\'') {
        quote = xml[end];
      } else if (xml[end] == '>') {
        break;
      }
    }
    tags.emplace_back(at, end);
  }
  return tags;
}

// A short, printable excerpt of what a file wrote, for messages (never the whole input).
std::string excerpt(const std::string& text) {
  std::string shown = valid_utf8(text.substr(0, 40));
  return "'" + shown + (text.size() > 40 ? "...'" : "'");
}

std::string trimmed(const std::string& text) {
  size_t first = text.find_first_not_of(" \t\r\n"), last = text.find_last_not_of(" \t\r\n");
  return first == std::string::npos ? std::string() : text.substr(first, last - first + 1);
}

// A whole-number attribute (xsd:int and kin: digits, an optional sign, spaces around); nothing
// when absent. Its range is the caller's to check.
std::optional<int64_t> whole_attribute(const std::string& tag, const char* name, const Field& field) {
  std::optional<std::string> text = xml_attribute(tag, name);
  if (!text) return std::nullopt;
  std::string number = trimmed(*text);
  if (!number.empty() && number[0] == '+') number.erase(0, 1);
  int64_t value = 0;
  auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), value);
  if (number.empty() || error != std::errc() || end != number.data() + number.size())
    field.refuse("is " + excerpt(*text) + ", not a whole number");
  return value;
}

int64_t required_size(const std::string& tag, const char* name, const std::string& path, int64_t high,
                      const char* why) {
  Field field(path, std::string("OME-XML Pixels ") + name);
  std::optional<int64_t> value = whole_attribute(tag, name, field);
  if (!value) field.refuse("is missing (the OME schema requires it)");
  return within(*value, 1, high, field, why);
}

// Microns per unit of OME's UnitsLength that a pixel size can sensibly be given in; 0 otherwise.
double microns_per(const std::string& unit) {
  static const std::map<std::string, double> units{{"nm", 1e-3}, {"µm", 1},  {"um", 1},    {"mm", 1e3},
                                                   {"cm", 1e4},  {"m", 1e6}, {"in", 25400}};
  auto found = units.find(unit);
  return found == units.end() ? 0 : found->second;
}

}  // namespace

std::vector<std::string> xml_start_tags(const std::string& xml, const std::string& element) {
  std::vector<std::string> tags;
  for (auto [begin, end] : find_start_tags(xml, element)) tags.push_back(xml.substr(begin, end - begin));
  return tags;
}

std::optional<std::string> xml_attribute(const std::string& tag, const std::string& name) {
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  size_t at = 1;
  while (at < tag.size() && !space(tag[at]) && tag[at] != '/') ++at;  // the element's name
  while (at < tag.size()) {
    while (at < tag.size() && (space(tag[at]) || tag[at] == '/')) ++at;
    size_t name_begin = at;
    while (at < tag.size() && !space(tag[at]) && tag[at] != '=') ++at;
    std::string_view found(tag.data() + name_begin, at - name_begin);
    while (at < tag.size() && space(tag[at])) ++at;
    if (at >= tag.size() || tag[at] != '=') return std::nullopt;  // not well-formed: no more attributes
    ++at;
    while (at < tag.size() && space(tag[at])) ++at;
    if (at >= tag.size() || (tag[at] != '"' && tag[at] != '\'')) return std::nullopt;
    size_t close = tag.find(tag[at], at + 1);
    if (close == std::string::npos) return std::nullopt;
    if (found == name) return valid_utf8(decode_entities(std::string_view(tag).substr(at + 1, close - at - 1)));
    at = close + 1;
  }
  return std::nullopt;
}

std::string xml_element_text(const std::string& xml, const std::string& element) {
  size_t open = xml.find("<" + element + ">");
  if (open == std::string::npos) return "";
  open += element.size() + 2;
  size_t close = xml.find("</" + element + ">", open);
  return close == std::string::npos ? ""
                                    : valid_utf8(decode_entities(std::string_view(xml).substr(open, close - open)));
}

int64_t OmePixels::plane_index(int64_t c, int64_t z, int64_t t) const {
  int64_t index = 0, stride = 1;
  for (char axis : dimension_order.substr(2)) {
    int64_t position = axis == 'C' ? c : axis == 'Z' ? z : t;
    index += position * stride;
    stride *= axis == 'C' ? channel_planes() : axis == 'Z' ? size_z : size_t_;
  }
  return index;
}

std::optional<OmePixels> read_ome_pixels(const std::string& xml, const std::string& path) {
  auto pixels_tags = find_start_tags(xml, "Pixels");
  if (pixels_tags.empty()) return std::nullopt;
  const size_t begin = pixels_tags.front().first, end = pixels_tags.front().second;
  const std::string tag = xml.substr(begin, end - begin);
  // The Pixels element's content: up to its end tag (none when it closes itself).
  size_t content_end = end > begin && xml[end - 1] == '/' ? end : xml.find("</Pixels>", end);
  OmePixels pixels;
  pixels.images = std::max<size_t>(1, find_start_tags(xml, "Image").size());

  static constexpr std::array<std::string_view, 6> orders{"XYZCT", "XYZTC", "XYCTZ", "XYCZT", "XYTCZ", "XYTZC"};
  std::optional<std::string> order = xml_attribute(tag, "DimensionOrder");
  Field order_field(path, "OME-XML Pixels DimensionOrder");
  if (!order) order_field.refuse("is missing (the OME schema requires it)");
  if (std::find(orders.begin(), orders.end(), *order) == orders.end())
    order_field.refuse("is " + excerpt(*order) +
                       ", not one of the OME schema's XYZCT, XYZTC, XYCTZ, XYCZT, XYTCZ, XYTZC (X and Y, then "
                       "Z, C and T once each)");
  pixels.dimension_order = *order;

  static constexpr std::array<std::string_view, 11> types{
      "int8", "int16", "int32", "uint8", "uint16", "uint32", "float", "double", "complex", "double-complex", "bit"};
  std::optional<std::string> type = xml_attribute(tag, "Type");
  Field type_field(path, "OME-XML Pixels Type");
  if (!type) type_field.refuse("is missing (the OME schema requires it)");
  if (std::find(types.begin(), types.end(), *type) == types.end())
    type_field.refuse("is " + excerpt(*type) + ", not one of the OME schema's pixel types (uint8, uint16, ...)");
  pixels.type = *type;

  pixels.size_x = required_size(tag, "SizeX", path, max_side, "a slide side tessera reads");
  pixels.size_y = required_size(tag, "SizeY", path, max_side, "a slide side tessera reads");
  pixels.size_c = required_size(tag, "SizeC", path, max_slide_channels, "channels a tile header holds");
  pixels.size_z = required_size(tag, "SizeZ", path, max_side, nullptr);
  pixels.size_t_ = required_size(tag, "SizeT", path, max_side, nullptr);

  auto content = [&](const std::string& element) {
    std::vector<std::string> tags;
    if (content_end == std::string::npos) content_end = xml.size();
    for (auto [from, to] : find_start_tags(xml, element, end, content_end)) tags.push_back(xml.substr(from, to - from));
    return tags;
  };
  // SamplesPerPixel: 1 for a grey plane, 3 for an RGB image; the channels' samples make up SizeC.
  auto channels = content("Channel");
  for (size_t c = 0; c < channels.size(); ++c) {
    Field field(path, "OME-XML Channel " + std::to_string(c) + " SamplesPerPixel");
    int64_t samples = within(whole_attribute(channels[c], "SamplesPerPixel", field).value_or(1), 1, pixels.size_c,
                             field, "at most SizeC");
    if (c > 0 && samples != pixels.channels[0].samples_per_pixel)
      field.refuse("is " + std::to_string(samples) + ", Channel 0's " +
                   std::to_string(pixels.channels[0].samples_per_pixel) + ": tessera reads channels of one kind");
    pixels.channels.push_back({xml_attribute(channels[c], "Name").value_or(""), samples});
  }
  if (!pixels.channels.empty()) {
    pixels.samples_per_pixel = pixels.channels[0].samples_per_pixel;
    if (static_cast<int64_t>(pixels.channels.size()) * pixels.samples_per_pixel != pixels.size_c) {
      auto count = [](int64_t n, const char* one, const char* many) {
        return std::to_string(n) + (n == 1 ? one : many);
      };
      const auto elements = static_cast<int64_t>(pixels.channels.size());
      Field(path, "OME-XML Pixels SizeC")
          .refuse("is " + std::to_string(pixels.size_c) + ", but its " +
                  count(elements, " Channel element holds ", " Channel elements hold ") +
                  count(elements * pixels.samples_per_pixel, " sample", " samples") + " (SamplesPerPixel " +
                  std::to_string(pixels.samples_per_pixel) + " each): the channels it declares disagree");
    }
  }

  if (std::optional<std::string> size = xml_attribute(tag, "PhysicalSizeX")) {
    Field field(path, "OME-XML Pixels PhysicalSizeX");
    std::string number = trimmed(*size);
    char* stop = nullptr;
    double value = std::strtod(number.c_str(), &stop);
    if (number.empty() || *stop != '\0' || !std::isfinite(value) || value <= 0)
      field.refuse("is " + excerpt(*size) + ", not a positive number (the OME schema's PositiveFloat)");
    pixels.microns_per_pixel = value * microns_per(xml_attribute(tag, "PhysicalSizeXUnit").value_or("µm"));
  }
  pixels.tiff_data = content("TiffData");
  for (const std::string& uuid : content("UUID"))
    if (auto name = xml_attribute(uuid, "FileName")) pixels.files.push_back(*name);
  return pixels;
}

std::vector<uint32_t> ome_plane_directories(const OmePixels& pixels, const std::string& path, uint32_t directories) {
  const int64_t channel_planes = pixels.channel_planes();
  Field size_field(path, "OME-XML Pixels SizeC x SizeZ x SizeT");
  const int64_t planes = multiply(multiply(channel_planes, pixels.size_z, size_field), pixels.size_t_, size_field);
  if (planes > directories)
    size_field.refuse("declares " + std::to_string(planes) + " planes (" + std::to_string(channel_planes) + " x " +
                      std::to_string(pixels.size_z) + " x " + std::to_string(pixels.size_t_) + "), but the file has " +
                      std::to_string(directories) + " TIFF directories: a plane needs one of its own");
  auto plane_name = [&](int64_t index) {
    int64_t position[3] = {0, 0, 0};  // C, Z, T
    for (char axis : pixels.dimension_order.substr(2)) {
      int64_t size = axis == 'C' ? channel_planes : axis == 'Z' ? pixels.size_z : pixels.size_t_;
      position[axis == 'C' ? 0 : axis == 'Z' ? 1 : 2] = index % size;
      index /= size;
    }
    return "plane (C " + std::to_string(position[0]) + ", Z " + std::to_string(position[1]) + ", T " +
           std::to_string(position[2]) + ")";
  };
  constexpr uint32_t unmapped = UINT32_MAX;
  std::vector<uint32_t> directory_of(static_cast<size_t>(planes), unmapped);
  std::vector<size_t> block_of(static_cast<size_t>(planes), 0);
  if (pixels.tiff_data.empty())  // no TiffData: the planes fill the directories in order
    for (int64_t plane = 0; plane < planes; ++plane)
      directory_of[static_cast<size_t>(plane)] = static_cast<uint32_t>(plane);
  for (size_t b = 0; b < pixels.tiff_data.size(); ++b) {
    const std::string& block = pixels.tiff_data[b];
    auto field = [&](const char* name) { return Field(path, "OME-XML TiffData " + std::to_string(b) + " " + name); };
    auto first_of = [&](const char* name, int64_t size) {
      Field first_field = field(name);
      return within(whole_attribute(block, name, first_field).value_or(0), 0, size - 1, first_field,
                    "a plane the Pixels hold");
    };
    const int64_t first = pixels.plane_index(first_of("FirstC", channel_planes), first_of("FirstZ", pixels.size_z),
                                             first_of("FirstT", pixels.size_t_));
    Field ifd_field = field("IFD");
    std::optional<int64_t> given_ifd = whole_attribute(block, "IFD", ifd_field);
    const int64_t ifd =
        within(given_ifd.value_or(0), 0, int64_t{directories} - 1, ifd_field, "the file's TIFF directories, from 0");
    // The schema's default: one plane where an IFD is given, else the planes from the first on.
    Field count_field = field("PlaneCount");
    const int64_t count =
        within(whole_attribute(block, "PlaneCount", count_field).value_or(given_ifd ? 1 : planes - first), 0,
               planes - first, count_field, "the planes from FirstC, FirstZ and FirstT on");
    if (ifd + count > directories)
      count_field.refuse("is " + std::to_string(count) + " from IFD " + std::to_string(ifd) +
                         ", past the file's last TIFF directory (" + std::to_string(directories - 1) + ")");
    for (int64_t k = 0; k < count; ++k) {
      auto plane = static_cast<size_t>(first + k);
      if (directory_of[plane] != unmapped)
        count_field.refuse("maps " + plane_name(first + k) + ", which TiffData " + std::to_string(block_of[plane]) +
                           " maps too");
      directory_of[plane] = static_cast<uint32_t>(ifd + k);
      block_of[plane] = b;
    }
  }
  std::map<uint32_t, int64_t> plane_in;  // directory -> the plane it holds
  for (int64_t plane = 0; plane < planes; ++plane) {
    uint32_t directory = directory_of[static_cast<size_t>(plane)];
    if (directory == unmapped) Field(path, "OME-XML TiffData").refuse("maps no TIFF directory to " + plane_name(plane));
    if (auto [held, fresh] = plane_in.emplace(directory, plane); !fresh)
      Field(path, "OME-XML TiffData")
          .refuse("maps " + plane_name(held->second) + " and " + plane_name(plane) + " to one TIFF directory, IFD " +
                  std::to_string(directory) + ": each plane has its own");
  }
  return directory_of;
}

}  // namespace tessera::data
