// What every HTML page tessera writes shares (sweep --export html, report --html): text escaped
// for HTML and SVG, and one look. Pages are self-contained: no outside resource is loaded.
#pragma once
#include <string>
#include <string_view>

namespace tessera {

// `text` safe inside an element or a quoted attribute.
inline std::string html_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// The style rules of every page: type, headings, tables, preformatted text.
inline constexpr const char* html_base_style = R"css(
body { font-family: sans-serif; margin: 24px; color: #222; background: #fff; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #eef2f7; }
pre { background: #f4f4f4; padding: 8px; white-space: pre-wrap; }
)css";

}  // namespace tessera
