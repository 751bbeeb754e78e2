// A field of a CSV file that tessera writes (a study's export, cross-validation's predictions),
// quoted as RFC 4180 and spreadsheets read it: only when it holds a comma, quote or line end.
#pragma once
#include <string>

namespace tessera {

inline std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

}  // namespace tessera
