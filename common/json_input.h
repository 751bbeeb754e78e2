// JSON that comes from outside tessera (files, HDF5 attributes, store entries, other processes),
// parsed within limits. nlohmann's parser itself does not recurse, but copying, comparing and
// dumping a value do, once per level: a document 100000 levels deep ends its reader by SIGSEGV.
// So nesting is refused while parsing, before any of that runs; so are a key given twice in one
// object (nlohmann would keep the last one silently) and numbers too large for a double. Errors
// name the source and quote a short excerpt around the offending byte, never the input.
#pragma once
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace tessera {

struct JsonLimits {
  // Real inputs nest a few levels (GeoJSON's MultiPolygon 5, a slide entry 4, a model
  // description 4); 64 leaves room and keeps every recursive walk a few KiB of stack.
  int max_depth = 64;
  // Values of any kind (scalars, arrays, objects), for inputs whose parsed form must stay small.
  uint64_t max_values = std::numeric_limits<uint64_t>::max();
};

// Bytes of context an error quotes around the offending byte.
constexpr size_t kJsonExcerptBytes = 80;

// `text` as JSON; throws BadInput (exit 5) "SOURCE: not valid JSON: PROBLEM (line L, column C),
// near "EXCERPT"" where it is not JSON (a number beyond a double's range included), and
// "SOURCE: JSON refused: ..." where it nests deeper or holds more values than `limits` or gives
// a key twice in one object.
nlohmann::json parse_json_input(std::string_view text, const std::string& source, const JsonLimits& limits = {});

// The file at `path` read whole and parsed as parse_json_input does; a file over `max_bytes` is
// refused before it is read. `source` names it in errors (the path, or "--encoder PATH").
nlohmann::json read_json_file(const std::string& path, const std::string& source, uint64_t max_bytes,
                              const JsonLimits& limits = {});

// `text` as JSON, or std::nullopt where parse_json_input would refuse it: for text that may be
// anything (a mask's ImageDescription, a child's report line).
std::optional<nlohmann::json> try_parse_json_input(std::string_view text, const JsonLimits& limits = {});

// At most `limit` bytes of `text`, bytes that are not printable ASCII escaped as \xNN, "..."
// where it is cut: a name or value from a file, fit to quote in a message.
std::string quoted_excerpt(std::string_view text, size_t limit = kJsonExcerptBytes);

// `value` as compact JSON, cut to about `limit` bytes ("..." where cut), strings escaped as
// quoted_excerpt does: what an error message shows of a value, whatever its size.
std::string json_excerpt(const nlohmann::json& value, size_t limit = kJsonExcerptBytes);

}  // namespace tessera
