#include "jobs/slide_labels.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include "common/error.h"

namespace tessera {

namespace {

namespace fs = std::filesystem;

std::string trim(const std::string& text) {
  auto first = text.find_first_not_of(" \t\r");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t\r") - first + 1);
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

// One CSV line as fields: commas separate, a field in double quotes may hold commas and "".
std::optional<std::vector<std::string>> split_fields(const std::string& line) {
  std::vector<std::string> fields;
  std::string field;
  bool quoted = false, was_quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (quoted) {
      if (c != '"') {
        field += c;
      } else if (i + 1 < line.size() && line[i + 1] == '"') {
        field += '"';
        ++i;
      } else {
        quoted = false;
      }
    } else if (c == '"' && trim(field).empty()) {
      quoted = was_quoted = true;
      field.clear();
    } else if (c == ',') {
      fields.push_back(was_quoted ? field : trim(field));
      field.clear();
      was_quoted = false;
    } else if (!was_quoted || !std::isspace(static_cast<unsigned char>(c))) {
      field += c;
    }
  }
  if (quoted) return std::nullopt;
  fields.push_back(was_quoted ? field : trim(field));
  return fields;
}

// Where the slide and label columns are: from a header naming them, else the first two of two.
struct Columns {
  size_t slide = 0, label = 1, count = 2;
  bool header = false;
  std::optional<size_t> case_id;  // CLAM's case_id column, when the header names one
};

Columns columns_of(const std::vector<std::string>& first) {
  Columns columns;
  std::optional<size_t> slide, label, case_id;
  for (size_t i = 0; i < first.size(); ++i) {
    std::string name = lower(first[i]);
    if (name == "slide_id" || (name == "slide" && !slide)) slide = i;
    if (name == "label") label = i;
    if (name == "case_id") case_id = i;
  }
  if (slide && label) columns = {*slide, *label, first.size(), true, case_id};
  return columns;
}

// A slide id names a feature file inside the features directory, never a path.
bool is_plain_name(const std::string& slide) {
  return slide != "." && slide != ".." && slide.find('/') == std::string::npos &&
         slide.find('\\') == std::string::npos && slide.find('\0') == std::string::npos;
}

}  // namespace

std::vector<SlideLabel> read_slide_labels(const std::string& labels_path, const std::string& features_dir) {
  std::ifstream in(labels_path, std::ios::binary);
  if (!in) throw BadInput(labels_path + ": cannot read the labels file");
  std::vector<SlideLabel> rows;
  std::map<std::string, size_t> seen;  // feature file -> its row in `rows`
  std::optional<Columns> columns;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (number == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);  // UTF-8 byte order mark
    if (trim(line).empty()) continue;
    std::string where = labels_path + " row " + std::to_string(number);
    auto fields = split_fields(line);
    if (!fields) throw BadInput(where + ": a quoted field is not closed: '" + trim(line) + "'");
    if (!columns) {
      columns = columns_of(*fields);
      if (columns->header) continue;
    }
    if (fields->size() != columns->count)
      throw BadInput(where + ": " + std::to_string(fields->size()) + " fields, expected " +
                     (columns->header ? std::to_string(columns->count) + " as the header has"
                                      : std::string("'slide,label' (or a header naming slide_id and label)")) +
                     ": '" + trim(line) + "'");
    SlideLabel row{(*fields)[columns->slide], "", (*fields)[columns->label], "", number};
    if (row.slide.empty() || row.label.empty()) throw BadInput(where + ": empty slide or label");
    row.case_id = columns->case_id ? (*fields)[*columns->case_id] : row.slide;
    if (row.case_id.empty()) throw BadInput(where + ": empty case_id (slide " + row.slide + ")");
    if (!is_plain_name(row.slide))
      throw BadInput(where + ": slide '" + row.slide + "' is a path; a labels file names feature files in --features " +
                     features_dir + " by their slide id (the file name without .h5)");
    fs::path file = fs::path(features_dir) / (row.slide + ".h5");
    // CLAM's slide_id may keep the slide's extension (s1.svs); its features are s1.h5.
    if (fs::path stem = fs::path(features_dir) / (fs::path(row.slide).stem().string() + ".h5");
        !fs::exists(file) && fs::path(row.slide).has_extension() && fs::exists(stem))
      file = stem;
    row.path = file.string();
    if (auto [at, fresh] = seen.emplace(file.filename().string(), rows.size()); !fresh) {
      const SlideLabel& first = rows[at->second];
      throw BadInput(where + ": slide " + row.slide + " is listed again (first at row " + std::to_string(first.row) +
                     " as '" + first.label + "', here '" + row.label + "'): one row a slide");
    }
    if (!fs::is_regular_file(file))
      throw BadInput(where + ": slide " + row.slide + " has no feature file " + row.path);
    rows.push_back(std::move(row));
  }
  if (rows.empty()) throw BadInput(labels_path + ": holds no slides");
  return rows;
}

}  // namespace tessera
