#include "common/json_input.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "common/error.h"

namespace tessera {

namespace {

using nlohmann::json;

// A pointer into the text that also tells where the lexer has read to: nlohmann reads through a
// copy of it, which writes its place back on every step, so that what the handler refuses (a
// level too deep, a key given twice) can be quoted where it lies.
class TrackedIterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;
  TrackedIterator(const char* at, const char** cursor) : at_(at), cursor_(cursor) {}
  reference operator*() const { return *at_; }
  TrackedIterator& operator++() {
    *cursor_ = ++at_;
    return *this;
  }
  TrackedIterator operator++(int) {
    TrackedIterator before = *this;
    ++*this;
    return before;
  }
  bool operator==(const TrackedIterator& other) const { return at_ == other.at_; }
  bool operator!=(const TrackedIterator& other) const { return at_ != other.at_; }

 private:
  const char* at_;
  const char** cursor_;
};

// nlohmann's SAX interface building the document as its own DOM parser does, but refusing
// depth, value count, duplicate keys and infinite numbers as they come. A refusal stops the parse
// (false); `problem` and `offending` say what and where.
class LimitedDocument {
 public:
  LimitedDocument(const JsonLimits& limits, const char* begin, const char* const* cursor)
      : limits_(limits), begin_(begin), cursor_(cursor) {}
  json root;
  std::string problem;
  bool syntax = false;   // not JSON at all, rather than JSON past a limit
  size_t offending = 0;  // byte offset of the offending byte

  bool null() { return add(nullptr); }
  bool boolean(bool value) { return add(value); }
  bool number_integer(json::number_integer_t value) { return add(value); }
  bool number_unsigned(json::number_unsigned_t value) { return add(value); }
  bool number_float(json::number_float_t value, const std::string&) {
    if (!std::isfinite(value)) return refuse("a number beyond the range of a double");
    return add(value);
  }
  bool string(std::string& value) { return add(std::move(value)); }
  bool binary(json::binary_t&) { return refuse("binary data"); }  // JSON text has none
  bool start_object(size_t) { return open(json::object()); }
  bool start_array(size_t) { return open(json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(std::string& name) {
    auto& object = open_.back()->get_ref<json::object_t&>();
    if (object.find(name) != object.end())
      return refuse("the key \"" + quoted_excerpt(name) + "\" is given twice in one object");
    slot_ = &object.emplace(std::move(name), nullptr).first->second;
    return true;
  }
  bool parse_error(size_t position, const std::string&, const json::exception& error) {
    // "[json.exception.parse_error.101] parse error at line 1, column 2: PROBLEM; last read:
    // 'TOKEN'; expected X": the place is said again below, and the token may be the whole input.
    std::string what = error.what();
    what.erase(0, what.find(']') == std::string::npos ? 0 : what.find(']') + 2);
    if (what.rfind("parse error at ", 0) == 0) what.erase(0, std::min(what.size(), what.find(": ") + 2));
    // "number overflow parsing '1e999'": the number may be a megabyte of digits.
    if (what.rfind("number overflow", 0) == 0) what = "a number beyond the range of a double";
    if (size_t token = what.find("; last read: '"); token != std::string::npos) {
      size_t expected = what.rfind("'; expected ");
      what.erase(token, expected == std::string::npos || expected < token ? std::string::npos : expected + 1 - token);
    }
    problem = what;
    syntax = true;
    offending = position > 0 ? position - 1 : 0;
    return false;
  }

 private:
  bool refuse(std::string what) {
    problem = std::move(what);
    size_t read = static_cast<size_t>(*cursor_ - begin_);
    offending = read > 0 ? read - 1 : 0;
    return false;
  }
  bool counted() {
    if (++values_ <= limits_.max_values) return true;
    return refuse("more than " + std::to_string(limits_.max_values) + " values");
  }
  // Where the next value goes: the root, the end of the open array, or the slot of the last key.
  json* place(json&& value) {
    if (open_.empty()) {
      root = std::move(value);
      return &root;
    }
    json& container = *open_.back();
    if (container.is_array()) {
      container.push_back(std::move(value));
      return &container.back();
    }
    *slot_ = std::move(value);
    return slot_;
  }
  template <class Value>
  bool add(Value&& value) {
    if (!counted()) return false;
    place(json(std::forward<Value>(value)));
    return true;
  }
  bool open(json&& container) {
    if (open_.size() >= static_cast<size_t>(limits_.max_depth))
      return refuse("nested deeper than " + std::to_string(limits_.max_depth) + " levels");
    if (!counted()) return false;
    open_.push_back(place(std::move(container)));
    return true;
  }
  bool close() {
    open_.pop_back();
    return true;
  }

  const JsonLimits& limits_;
  const char* begin_;
  const char* const* cursor_;
  std::vector<json*> open_;  // the arrays and objects being filled, outermost first
  json* slot_ = nullptr;
  uint64_t values_ = 0;
};

// Parses `text` into `document`; false where it refused.
bool parse_limited(std::string_view text, LimitedDocument& document, const char** cursor) {
  TrackedIterator first(text.data(), cursor), last(text.data() + text.size(), cursor);
  return json::sax_parse(first, last, &document);
}

// Bytes of a valid UTF-8 sequence at `at` (2 to 4), or 0.
size_t utf8_sequence(std::string_view text, size_t at) {
  auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  unsigned char lead = byte(at);
  size_t length = lead >= 0xC2 && lead <= 0xDF ? 2 : lead >= 0xE0 && lead <= 0xEF ? 3 : lead >= 0xF0 && lead <= 0xF4 ? 4 : 0;
  if (length == 0 || at + length > text.size()) return 0;
  // The second byte's range excludes overlong forms, surrogates and code points past U+10FFFF.
  unsigned char low = lead == 0xE0 ? 0xA0 : lead == 0xF0 ? 0x90 : 0x80;
  unsigned char high = lead == 0xED ? 0x9F : lead == 0xF4 ? 0x8F : 0xBF;
  if (byte(at + 1) < low || byte(at + 1) > high) return 0;
  for (size_t i = 2; i < length; ++i)
    if (byte(at + i) < 0x80 || byte(at + i) > 0xBF) return 0;
  return length;
}

// The unit of text at `at` as a message shows it, and the bytes it covers.
std::pair<std::string, size_t> shown_unit(std::string_view text, size_t at) {
  auto byte = static_cast<unsigned char>(text[at]);
  if (byte >= 0x20 && byte < 0x7F) return {std::string(1, text[at]), 1};
  if (size_t length = utf8_sequence(text, at)) return {std::string(text.substr(at, length)), length};
  static const char* const digits = "0123456789abcdef";
  return {std::string("\\x") + digits[byte >> 4] + digits[byte & 15], 1};
}

// About `budget` bytes of the text before `end`, shown as quoted_excerpt shows them.
std::string shown_before(std::string_view text, size_t end, size_t budget) {
  // Start far enough back for the budget, then on a unit's start: not in a UTF-8 sequence.
  size_t start = end > budget ? end - budget : 0;
  while (start > 0 && start < end && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  std::vector<std::string> units;
  size_t shown = 0;
  for (size_t at = start; at < end;) {
    auto [unit, length] = shown_unit(text, at);
    units.push_back(std::move(unit));
    shown += units.back().size();
    at += length;
  }
  std::string out;
  size_t skip = 0;
  while (shown > budget && skip < units.size()) shown -= units[skip++].size();
  if (skip > 0 || start > 0) out = "...";
  for (size_t i = skip; i < units.size(); ++i) out += units[i];
  return out;
}

std::string excerpt_at(std::string_view text, size_t offending) {
  offending = std::min(offending, text.size());
  std::string before = shown_before(text, offending, kJsonExcerptBytes / 2);
  return before + quoted_excerpt(text.substr(offending), kJsonExcerptBytes / 2);
}

[[noreturn]] void refuse_document(std::string_view text, const std::string& source, const LimitedDocument& document) {
  size_t line = 1, column = 1;
  for (size_t i = 0; i < document.offending && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) {
      ++column;
    }
  }
  throw BadInput(source + (document.syntax ? ": not valid JSON: " : ": JSON refused: ") + document.problem + " (line " + std::to_string(line) + ", column " +
                 std::to_string(column) + "), near \"" + excerpt_at(text, document.offending) + "\"");
}

void render(const json& value, std::string& out, size_t limit) {
  if (out.size() > limit) return;
  switch (value.type()) {
    case json::value_t::object: {
      out += '{';
      for (auto it = value.begin(); it != value.end() && out.size() <= limit; ++it) {
        if (it != value.begin()) out += ',';
        out += '"' + quoted_excerpt(it.key(), limit) + "\":";
        render(it.value(), out, limit);
      }
      out += '}';
      break;
    }
    case json::value_t::array: {
      out += '[';
      for (auto it = value.begin(); it != value.end() && out.size() <= limit; ++it) {
        if (it != value.begin()) out += ',';
        render(*it, out, limit);
      }
      out += ']';
      break;
    }
    case json::value_t::string:
      out += '"' + quoted_excerpt(value.get_ref<const std::string&>(), limit) + '"';
      break;
    case json::value_t::binary:
      out += "<binary>";
      break;
    default:
      out += value.dump();  // a number, a boolean, null: a few bytes
  }
}

}  // namespace

nlohmann::json parse_json_input(std::string_view text, const std::string& source, const JsonLimits& limits) {
  const char* cursor = text.data();
  LimitedDocument document(limits, text.data(), &cursor);
  if (!parse_limited(text, document, &cursor)) refuse_document(text, source, document);
  return std::move(document.root);
}

std::optional<nlohmann::json> try_parse_json_input(std::string_view text, const JsonLimits& limits) {
  const char* cursor = text.data();
  LimitedDocument document(limits, text.data(), &cursor);
  if (!parse_limited(text, document, &cursor)) return std::nullopt;
  return std::move(document.root);
}

nlohmann::json read_json_file(const std::string& path, const std::string& source, uint64_t max_bytes,
                              const JsonLimits& limits) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) throw BadInput(source + ": a directory, not a JSON file");
  const uint64_t size = std::filesystem::file_size(path, error);
  if (error) throw BadInput(source + ": cannot read (" + error.message() + ")");
  if (size > max_bytes)
    throw BadInput(source + ": " + std::to_string(size) + " bytes, more than the " + std::to_string(max_bytes) +
                   " such a file may hold");
  std::ifstream in(path, std::ios::binary);
  std::string text(size, '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(size)))
    throw BadInput(source + ": cannot read (it changed while read?)");
  return parse_json_input(text, source, limits);
}

std::string quoted_excerpt(std::string_view text, size_t limit) {
  std::string out;
  for (size_t at = 0; at < text.size();) {
    auto [unit, length] = shown_unit(text, at);
    if (out.size() + unit.size() > limit) return out + "...";
    out += unit;
    at += length;
  }
  return out;
}

std::string json_excerpt(const nlohmann::json& value, size_t limit) {
  std::string out;
  render(value, out, limit);
  if (out.size() <= limit) return out;
  // Cut on a character's first byte: what is cut stays valid UTF-8.
  size_t cut = limit;
  while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xC0) == 0x80) --cut;
  return out.substr(0, cut) + "...";
}

}  // namespace tessera
