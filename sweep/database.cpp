#include "sweep/database.h"

#include <charconv>

#include "common/error.h"

namespace tessera::sweep {

std::unique_ptr<Database> open_sqlite_database(const std::string& path, bool read_only);
std::unique_ptr<Database> open_postgres_database(const std::string& url, bool read_only);

int64_t Row::integer(size_t column) const {
  auto& cell = cells_.at(column);
  if (auto* value = std::get_if<int64_t>(&cell)) return *value;
  if (auto* value = std::get_if<double>(&cell)) return static_cast<int64_t>(*value);
  if (auto* text = std::get_if<std::string>(&cell)) {
    int64_t value = 0;
    auto [end, error] = std::from_chars(text->data(), text->data() + text->size(), value);
    if (error == std::errc() && end == text->data() + text->size()) return value;
  }
  throw BadInput("the study holds a damaged number");
}

double Row::real(size_t column) const {
  auto& cell = cells_.at(column);
  if (auto* value = std::get_if<double>(&cell)) return *value;
  if (auto* value = std::get_if<int64_t>(&cell)) return static_cast<double>(*value);
  throw BadInput("the study holds a damaged number");
}

std::string Row::text(size_t column) const {
  auto& cell = cells_.at(column);
  if (auto* text = std::get_if<std::string>(&cell)) return *text;
  if (std::holds_alternative<std::monostate>(cell)) return {};
  throw BadInput("the study holds a number where text belongs");
}

std::string Database::with_column_types(std::string_view generic, std::string_view id, std::string_view integer,
                                        std::string_view real) {
  std::string out(generic);
  for (auto [from, to] : {std::pair{std::string_view("{id}"), id}, {"{int}", integer}, {"{real}", real}})
    for (size_t at = out.find(from); at != std::string::npos; at = out.find(from, at + to.size()))
      out.replace(at, from.size(), to);
  return out;
}

bool is_postgres_location(std::string_view location) {
  return location.starts_with("postgresql://") || location.starts_with("postgres://");
}

std::unique_ptr<Database> open_database(const std::string& location, bool read_only) {
  if (is_postgres_location(location)) return open_postgres_database(location, read_only);
  return open_sqlite_database(location, read_only);
}

}  // namespace tessera::sweep
