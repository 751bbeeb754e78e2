// The SQL the study store needs from SQLite (one machine) and PostgreSQL (libpq, any number of
// workers): statements with `?` parameters, checked transactions, and the server's clock.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace tessera::sweep {

using SqlValue = std::variant<std::monostate, int64_t, double, std::string>;

// One result row; cells keep the type the database gave them.
class Row {
 public:
  explicit Row(std::vector<SqlValue> cells) : cells_(std::move(cells)) {}
  bool is_null(size_t column) const { return std::holds_alternative<std::monostate>(cells_.at(column)); }
  int64_t integer(size_t column) const;
  double real(size_t column) const;
  std::string text(size_t column) const;
  template <typename T>
  std::optional<T> optional(size_t column) const {
    if (is_null(column)) return std::nullopt;
    if constexpr (std::is_floating_point_v<T>) return real(column);
    else return static_cast<T>(integer(column));
  }

 private:
  std::vector<SqlValue> cells_;
};

struct QueryResult {
  std::vector<Row> rows;
  int64_t changed = 0;  // rows an INSERT, UPDATE or DELETE changed
};

class Database {
 public:
  virtual ~Database() = default;
  // Where the study lives, for messages (a path, or the URL without its password).
  virtual const std::string& name() const = 0;
  virtual bool is_postgres() const = 0;
  // Statements without parameters, separated by semicolons (the schema).
  virtual void execute_script(const std::string& sql) = 0;
  // One statement with `?` placeholders bound in order. Throws Error naming the store.
  virtual QueryResult query(const std::string& sql, const std::vector<SqlValue>& parameters = {}) = 0;
  // A transaction; one that writes takes SQLite's write lock at BEGIN, so that reading then
  // writing never deadlocks, and one that only reads takes no lock a writer waits for. Every
  // result is checked.
  virtual void begin(bool writes) = 0;
  virtual void commit() = 0;
  // Never throws: a rollback that fails leaves the connection unusable (the next call throws).
  virtual void rollback() noexcept = 0;
  // False when no sweep is writing the study (an SQLite file whose lock nobody holds); true when
  // one is, or when that cannot be known (PostgreSQL: heartbeats tell).
  virtual bool writer_running() { return true; }
  // Table names in the study's schema.
  virtual std::vector<std::string> tables() = 0;
  // SQL for the server's clock in seconds since the epoch: workers on several machines compare
  // heartbeats on one clock.
  virtual std::string_view now_sql() const = 0;
  // Column types for the schema: {id} {int} {real}.
  virtual std::string schema(std::string_view generic) const = 0;

 protected:
  static std::string with_column_types(std::string_view generic, std::string_view id, std::string_view integer,
                                       std::string_view real);
};

// `location` is a file path (SQLite) or a postgresql:// or postgres:// URL. Throws BadInput for
// a file or server that cannot be opened.
std::unique_ptr<Database> open_database(const std::string& location, bool read_only);
bool is_postgres_location(std::string_view location);

// Rolls back unless committed.
class Transaction {
 public:
  enum class Kind { writes, reads };
  explicit Transaction(Database& database, Kind kind = Kind::writes) : database_(database) {
    database_.begin(kind == Kind::writes);
  }
  ~Transaction() {
    if (!committed_) database_.rollback();
  }
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  void commit() {
    database_.commit();
    committed_ = true;
  }

 private:
  Database& database_;
  bool committed_ = false;
};

}  // namespace tessera::sweep
