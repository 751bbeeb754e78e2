// The study in one SQLite file (WAL). A writer holds flock() on the file for its life, so that two
// sweeps never write one study; readers (--show, --export) take no lock.
#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/error.h"
#include "sweep/database.h"

namespace tessera::sweep {

namespace {

class SqliteDatabase final : public Database {
 public:
  SqliteDatabase(const std::string& path, bool read_only) : name_(path) {
    std::error_code error;
    bool exists = std::filesystem::exists(path, error);
    if (read_only && !exists) throw BadInput(path + ": no such study file");
    if (!read_only) lock_for_writing();
    int flags = read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
    if (sqlite3_open_v2(path.c_str(), &db_, flags, nullptr) != SQLITE_OK) {
      std::string message = db_ ? sqlite3_errmsg(db_) : "cannot open";
      close();
      throw BadInput(path + ": " + message);
    }
    sqlite3_busy_timeout(db_, 10000);
  }
  ~SqliteDatabase() override { close(); }

  const std::string& name() const override { return name_; }
  bool is_postgres() const override { return false; }

  void execute_script(const std::string& sql) override {
    check_usable();
    char* message = nullptr;
    if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &message) != SQLITE_OK) {
      std::string text = message ? message : sqlite3_errmsg(db_);
      sqlite3_free(message);
      throw Error(ExitCode::runtime_error, name_ + ": " + text);
    }
  }

  QueryResult query(const std::string& sql, const std::vector<SqlValue>& parameters) override {
    check_usable();
    sqlite3_stmt* statement = nullptr;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &statement, nullptr) != SQLITE_OK) fail("prepare");
    struct Finalize {
      sqlite3_stmt* s;
      ~Finalize() { sqlite3_finalize(s); }
    } finalize{statement};
    for (size_t i = 0; i < parameters.size(); ++i) {
      int index = static_cast<int>(i) + 1, result = SQLITE_OK;
      auto& value = parameters[i];
      if (auto* integer = std::get_if<int64_t>(&value)) result = sqlite3_bind_int64(statement, index, *integer);
      else if (auto* real = std::get_if<double>(&value)) result = sqlite3_bind_double(statement, index, *real);
      else if (auto* text = std::get_if<std::string>(&value))
        result = sqlite3_bind_text(statement, index, text->c_str(), static_cast<int>(text->size()), SQLITE_TRANSIENT);
      else result = sqlite3_bind_null(statement, index);
      if (result != SQLITE_OK) fail("bind");
    }
    QueryResult out;
    int result;
    while ((result = sqlite3_step(statement)) == SQLITE_ROW) {
      std::vector<SqlValue> cells;
      for (int c = 0, n = sqlite3_column_count(statement); c < n; ++c) {
        switch (sqlite3_column_type(statement, c)) {
          case SQLITE_INTEGER: cells.emplace_back(int64_t{sqlite3_column_int64(statement, c)}); break;
          case SQLITE_FLOAT: cells.emplace_back(sqlite3_column_double(statement, c)); break;
          case SQLITE_NULL: cells.emplace_back(std::monostate{}); break;
          default: {
            auto* bytes = reinterpret_cast<const char*>(sqlite3_column_text(statement, c));
            cells.emplace_back(std::string(bytes ? bytes : "", static_cast<size_t>(sqlite3_column_bytes(statement, c))));
          }
        }
      }
      out.rows.emplace_back(std::move(cells));
    }
    if (result != SQLITE_DONE) fail("step");
    out.changed = sqlite3_changes(db_);
    return out;
  }

  void begin(bool writes) override { execute_script(writes ? "BEGIN IMMEDIATE" : "BEGIN"); }
  void commit() override { execute_script("COMMIT"); }
  void rollback() noexcept override {
    // An error such as SQLITE_FULL may have rolled the transaction back already.
    if (!db_ || sqlite3_get_autocommit(db_)) return;
    if (sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr) != SQLITE_OK)
      broken_ = std::string("ROLLBACK failed: ") + sqlite3_errmsg(db_);
  }

  std::vector<std::string> tables() override {
    std::vector<std::string> names;
    try {
      for (auto& row : query("SELECT name FROM sqlite_master WHERE type = 'table'", {}).rows)
        names.push_back(row.text(0));
    } catch (const Error& e) {
      throw BadInput(name_ + " is not a tessera study (" + e.what() + ")");
    }
    return names;
  }

  bool writer_running() override {
    if (lock_fd_ >= 0) return true;
    int fd = ::open(name_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    // A shared lock for an instant: a writer starting meanwhile retries (lock_for_writing).
    bool running = flock(fd, LOCK_SH | LOCK_NB) != 0;
    ::close(fd);
    return running;
  }

  std::string_view now_sql() const override { return "((julianday('now') - 2440587.5) * 86400.0)"; }

  std::string schema(std::string_view generic) const override {
    return with_column_types(generic, "INTEGER PRIMARY KEY", "INTEGER", "REAL");
  }

 private:
  // Held until the process ends or closes the study; children do not inherit it (O_CLOEXEC), so
  // a trial outliving a killed sweep does not keep the study locked.
  void lock_for_writing() {
    lock_fd_ = ::open(name_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock_fd_ < 0) throw BadInput(name_ + ": " + std::strerror(errno));
    // A reader probing for a writer (writer_running) holds the lock for microseconds: try for a second.
    int error = 0;
    for (int tries = 0; tries < 100; ++tries) {
      if (flock(lock_fd_, LOCK_EX | LOCK_NB) == 0) return;
      error = errno;
      if (error != EWOULDBLOCK) break;
      usleep(10000);
    }
    close();
    if (error == EWOULDBLOCK)
      throw UsageError(name_ + ": another sweep is running this study; wait for it to end, or share a study "
                               "between several sweeps in PostgreSQL (--study postgresql://...)");
    throw BadInput(name_ + ": cannot lock: " + std::strerror(error));
  }

  void check_usable() const {
    if (!broken_.empty()) throw Error(ExitCode::runtime_error, name_ + ": " + broken_);
  }
  [[noreturn]] void fail(const char* what) const {
    throw Error(ExitCode::runtime_error, name_ + ": " + what + ": " + sqlite3_errmsg(db_));
  }
  void close() {
    if (db_) sqlite3_close(db_);
    db_ = nullptr;
    if (lock_fd_ >= 0) ::close(lock_fd_);
    lock_fd_ = -1;
  }

  std::string name_, broken_;
  sqlite3* db_ = nullptr;
  int lock_fd_ = -1;
};

}  // namespace

std::unique_ptr<Database> open_sqlite_database(const std::string& path, bool read_only) {
  return std::make_unique<SqliteDatabase>(path, read_only);
}

}  // namespace tessera::sweep
