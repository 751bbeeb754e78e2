// The study in PostgreSQL through libpq: one connection per sweep worker. Statements are sent
// with text parameters ($1, $2 ... in place of `?`) and the server infers their types.
#include <libpq-fe.h>

#include <charconv>
#include <cstdlib>

#include "common/error.h"
#include "sweep/database.h"

namespace tessera::sweep {

namespace {

// The URL as it may appear in messages: without a password.
std::string without_password(const std::string& url) {
  auto scheme = url.find("://");
  auto at = url.find('@', scheme + 3);
  auto colon = url.find(':', scheme + 3);
  if (at == std::string::npos || colon == std::string::npos || colon > at) return url;
  return url.substr(0, colon) + url.substr(at);
}

std::string numbered_placeholders(const std::string& sql) {
  std::string out;
  int next = 1;
  for (char c : sql) {
    if (c == '?') out += "$" + std::to_string(next++);
    else out += c;
  }
  return out;
}

std::string parameter_text(double value) {
  if (value != value) return "NaN";
  if (value > 0 && value * 0.5 == value) return "Infinity";
  if (value < 0 && value * 0.5 == value) return "-Infinity";
  char text[32];
  auto [end, error] = std::to_chars(text, text + sizeof text, value);
  return std::string(text, end);
}

// Type OIDs (pg_type.h) of the columns the store reads as numbers.
constexpr Oid bool_oid = 16, int8_oid = 20, int2_oid = 21, int4_oid = 23, float4_oid = 700, float8_oid = 701,
              numeric_oid = 1700;

class PostgresDatabase final : public Database {
 public:
  PostgresDatabase(const std::string& url, bool read_only) : name_(without_password(url)) {
    connection_ = PQconnectdb(url.c_str());
    if (PQstatus(connection_) != CONNECTION_OK) {
      std::string message = PQerrorMessage(connection_);
      while (!message.empty() && message.back() == '\n') message.pop_back();
      PQfinish(connection_);
      connection_ = nullptr;
      throw BadInput(name_ + ": cannot connect: " + message);
    }
    // Notices such as "relation already exists, skipping" are not for the user.
    PQsetNoticeProcessor(connection_, [](void*, const char*) {}, nullptr);
    if (read_only) execute_script("SET default_transaction_read_only = on");
  }
  ~PostgresDatabase() override { PQfinish(connection_); }

  const std::string& name() const override { return name_; }
  bool is_postgres() const override { return true; }

  void execute_script(const std::string& sql) override {
    check_usable();
    Result result(PQexec(connection_, sql.c_str()));
    check(result.get(), "");
  }

  QueryResult query(const std::string& sql, const std::vector<SqlValue>& parameters) override {
    check_usable();
    std::vector<std::string> texts(parameters.size());
    std::vector<const char*> values(parameters.size(), nullptr);
    for (size_t i = 0; i < parameters.size(); ++i) {
      auto& value = parameters[i];
      if (auto* integer = std::get_if<int64_t>(&value)) texts[i] = std::to_string(*integer);
      else if (auto* real = std::get_if<double>(&value)) texts[i] = parameter_text(*real);
      else if (auto* text = std::get_if<std::string>(&value)) texts[i] = *text;
      else continue;
      values[i] = texts[i].c_str();
    }
    auto statement = numbered_placeholders(sql);
    Result result(PQexecParams(connection_, statement.c_str(), static_cast<int>(values.size()), nullptr,
                               values.data(), nullptr, nullptr, 0));
    check(result.get(), statement);
    QueryResult out;
    int rows = PQntuples(result.get()), columns = PQnfields(result.get());
    for (int r = 0; r < rows; ++r) {
      std::vector<SqlValue> cells;
      for (int c = 0; c < columns; ++c) {
        if (PQgetisnull(result.get(), r, c)) {
          cells.emplace_back(std::monostate{});
          continue;
        }
        std::string text(PQgetvalue(result.get(), r, c), static_cast<size_t>(PQgetlength(result.get(), r, c)));
        switch (PQftype(result.get(), c)) {
          case bool_oid: cells.emplace_back(int64_t{text == "t"}); break;
          case int2_oid:
          case int4_oid:
          case int8_oid: cells.emplace_back(int64_t{std::strtoll(text.c_str(), nullptr, 10)}); break;
          case float4_oid:
          case float8_oid:
          case numeric_oid: cells.emplace_back(std::strtod(text.c_str(), nullptr)); break;
          default: cells.emplace_back(std::move(text));
        }
      }
      out.rows.emplace_back(std::move(cells));
    }
    const char* changed = PQcmdTuples(result.get());
    out.changed = changed && *changed ? std::strtoll(changed, nullptr, 10) : 0;
    return out;
  }

  // REPEATABLE READ gives a read one snapshot; writers order themselves by row locks.
  void begin(bool writes) override { execute_script(writes ? "BEGIN" : "BEGIN ISOLATION LEVEL REPEATABLE READ"); }
  void commit() override {
    check_usable();
    Result result(PQexec(connection_, "COMMIT"));
    check(result.get(), "COMMIT");
    // A transaction that failed earlier "commits" as a rollback.
    if (std::string_view(PQcmdStatus(result.get())) != "COMMIT")
      throw Error(ExitCode::runtime_error, name_ + ": COMMIT was rolled back");
  }
  void rollback() noexcept override {
    if (!connection_ || PQtransactionStatus(connection_) == PQTRANS_IDLE) return;
    Result result(PQexec(connection_, "ROLLBACK"));
    if (PQresultStatus(result.get()) != PGRES_COMMAND_OK)
      broken_ = std::string("ROLLBACK failed: ") + PQerrorMessage(connection_);
  }

  std::vector<std::string> tables() override {
    std::vector<std::string> names;
    for (auto& row : query("SELECT table_name::text FROM information_schema.tables WHERE table_schema = current_schema()", {}).rows)
      names.push_back(row.text(0));
    return names;
  }

  std::string_view now_sql() const override { return "(EXTRACT(EPOCH FROM clock_timestamp())::double precision)"; }

  std::string schema(std::string_view generic) const override {
    return with_column_types(generic, "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY", "BIGINT", "DOUBLE PRECISION");
  }

 private:
  struct Clear {
    void operator()(PGresult* result) const { PQclear(result); }
  };
  using Result = std::unique_ptr<PGresult, Clear>;

  void check(PGresult* result, const std::string& statement) const {
    auto status = PQresultStatus(result);
    if (status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK) return;
    std::string message = PQerrorMessage(connection_);
    while (!message.empty() && message.back() == '\n') message.pop_back();
    throw Error(ExitCode::runtime_error,
                name_ + ": " + message + (statement.empty() ? "" : " (in: " + statement.substr(0, 80) + ")"));
  }
  void check_usable() const {
    if (!broken_.empty()) throw Error(ExitCode::runtime_error, name_ + ": " + broken_);
  }

  std::string name_, broken_;
  PGconn* connection_ = nullptr;
};

}  // namespace

std::unique_ptr<Database> open_postgres_database(const std::string& url, bool read_only) {
  return std::make_unique<PostgresDatabase>(url, read_only);
}

}  // namespace tessera::sweep
