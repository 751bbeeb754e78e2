#include "sweep/store.h"

#include <sqlite3.h>

#include <chrono>

#include "common/error.h"

namespace tessera::sweep {

namespace {

// Written to the format table; a file without it is not a study.
constexpr int format_version = 1;

const char* schema = R"sql(
CREATE TABLE tessera_study_format(version INTEGER NOT NULL);
CREATE TABLE studies(
  id INTEGER PRIMARY KEY, direction TEXT NOT NULL, sampler TEXT NOT NULL, pruner TEXT NOT NULL,
  seed INTEGER NOT NULL, target_trials INTEGER NOT NULL, space TEXT NOT NULL, train_flags TEXT NOT NULL,
  created REAL NOT NULL);
CREATE TABLE trials(
  id INTEGER PRIMARY KEY, study_id INTEGER NOT NULL REFERENCES studies(id), number INTEGER NOT NULL,
  state TEXT NOT NULL, params TEXT NOT NULL, value REAL, UNIQUE(study_id, number));
CREATE TABLE attempts(
  id INTEGER PRIMARY KEY, trial_id INTEGER NOT NULL REFERENCES trials(id), attempt INTEGER NOT NULL,
  state TEXT NOT NULL, command TEXT NOT NULL, batch INTEGER, accumulate INTEGER, device_index INTEGER,
  device TEXT, exit_code INTEGER, signal INTEGER, stderr_tail TEXT, peak_device_bytes INTEGER, value REAL,
  metrics TEXT, intermediate TEXT NOT NULL, sweep_rss_bytes INTEGER, started REAL NOT NULL, finished REAL,
  UNIQUE(trial_id, attempt));
)sql";

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// One prepared statement; binds by position from 1.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) : db_(db) {
    if (sqlite3_prepare_v2(db, sql, -1, &statement_, nullptr) != SQLITE_OK) fail("prepare");
  }
  ~Statement() { sqlite3_finalize(statement_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  Statement& bind(int index, int64_t value) {
    sqlite3_bind_int64(statement_, index, value);
    return *this;
  }
  Statement& bind(int index, const std::string& value) {
    sqlite3_bind_text(statement_, index, value.c_str(), static_cast<int>(value.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Statement& bind(int index, double value) {
    sqlite3_bind_double(statement_, index, value);
    return *this;
  }
  template <typename T>
  Statement& bind(int index, const std::optional<T>& value) {
    if (value) return bind(index, static_cast<std::conditional_t<std::is_floating_point_v<T>, double, int64_t>>(*value));
    sqlite3_bind_null(statement_, index);
    return *this;
  }
  // True while there is a row.
  bool step() {
    int result = sqlite3_step(statement_);
    if (result == SQLITE_ROW) return true;
    if (result != SQLITE_DONE) fail("step");
    return false;
  }
  void run() {
    while (step()) {
    }
  }
  bool is_null(int column) const { return sqlite3_column_type(statement_, column) == SQLITE_NULL; }
  int64_t integer(int column) const { return sqlite3_column_int64(statement_, column); }
  double real(int column) const { return sqlite3_column_double(statement_, column); }
  std::string text(int column) const {
    auto* bytes = sqlite3_column_text(statement_, column);
    return bytes ? reinterpret_cast<const char*>(bytes) : "";
  }
  template <typename T>
  std::optional<T> optional(int column) const {
    if (is_null(column)) return std::nullopt;
    if constexpr (std::is_floating_point_v<T>) return real(column);
    else return static_cast<T>(integer(column));
  }

 private:
  [[noreturn]] void fail(const char* what) const {
    throw Error(ExitCode::runtime_error, std::string("study store: ") + what + ": " + sqlite3_errmsg(db_));
  }
  sqlite3* db_;
  sqlite3_stmt* statement_ = nullptr;
};

class Transaction {
 public:
  explicit Transaction(sqlite3* db) : db_(db) { sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr); }
  ~Transaction() { sqlite3_exec(db_, committed_ ? "COMMIT" : "ROLLBACK", nullptr, nullptr, nullptr); }
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  void commit() { committed_ = true; }

 private:
  sqlite3* db_;
  bool committed_ = false;
};

nlohmann::json parse_json(const std::string& text, const char* what) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    throw BadInput(std::string("the study's ") + what + " is damaged");
  }
}

nlohmann::json intermediate_json(const Attempt& attempt) {
  nlohmann::json out = nlohmann::json::array();
  for (auto& [step, value] : attempt.intermediate) out.push_back({step, value});
  return out;
}

}  // namespace

StudyStore::StudyStore(const std::filesystem::path& path, Mode mode) : path_(path) {
  std::error_code error;
  bool exists = std::filesystem::exists(path, error);
  if (mode == Mode::read_only && !exists) throw BadInput(path.string() + ": no such study file");
  int flags = mode == Mode::read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
  if (sqlite3_open_v2(path.c_str(), &db_, flags, nullptr) != SQLITE_OK) {
    std::string message = db_ ? sqlite3_errmsg(db_) : "cannot open";
    sqlite3_close(db_);
    db_ = nullptr;
    throw BadInput(path.string() + ": " + message);
  }
  try {
    initialize(mode);
  } catch (...) {
    sqlite3_close(db_);
    throw;
  }
}

void StudyStore::initialize(Mode mode) {
  sqlite3_busy_timeout(db_, 10000);
  auto not_a_study = [&](const std::string& why) {
    return BadInput(path_.string() + " is not a tessera study (" + why + ")");
  };
  // Reading the schema is the first thing that touches the file's contents.
  int tables = 0;
  bool has_format = false;
  {
    sqlite3_stmt* statement = nullptr;
    int result = sqlite3_prepare_v2(db_, "SELECT name FROM sqlite_master WHERE type = 'table'", -1, &statement, nullptr);
    if (result == SQLITE_OK)
      while ((result = sqlite3_step(statement)) == SQLITE_ROW) {
        ++tables;
        auto* name = reinterpret_cast<const char*>(sqlite3_column_text(statement, 0));
        has_format = has_format || std::string_view(name) == "tessera_study_format";
      }
    sqlite3_finalize(statement);
    if (result != SQLITE_DONE) throw not_a_study(sqlite3_errstr(result));
  }
  if (tables > 0 && !has_format) throw not_a_study("an SQLite database without tessera's tables");
  if (tables == 0 && mode == Mode::read_only) throw not_a_study("an empty database");
  if (mode == Mode::read_write) {
    execute("PRAGMA journal_mode = WAL");
    execute("PRAGMA synchronous = NORMAL");
    execute("PRAGMA foreign_keys = ON");
    if (tables == 0) {
      Transaction transaction(db_);
      execute(schema);
      Statement(db_, "INSERT INTO tessera_study_format(version) VALUES (?)").bind(1, int64_t{format_version}).run();
      transaction.commit();
    }
  }
  Statement version(db_, "SELECT version FROM tessera_study_format");
  if (!version.step() || version.integer(0) != format_version)
    throw not_a_study("a study format this tessera does not read");
}

StudyStore::~StudyStore() { sqlite3_close(db_); }

void StudyStore::execute(const char* sql) const {
  char* message = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &message) != SQLITE_OK) {
    std::string text = message ? message : "unknown error";
    sqlite3_free(message);
    throw Error(ExitCode::runtime_error, path_.string() + ": " + text);
  }
}

bool StudyStore::has_study() const {
  Statement count(db_, "SELECT COUNT(*) FROM studies");
  count.step();
  return count.integer(0) > 0;
}

void StudyStore::create_study(const StudyConfig& config) {
  Statement(db_,
            "INSERT INTO studies(id, direction, sampler, pruner, seed, target_trials, space, train_flags, created) "
            "VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?)")
      .bind(1, std::string(to_string(config.direction)))
      .bind(2, config.sampler)
      .bind(3, config.pruner)
      .bind(4, static_cast<int64_t>(config.seed))
      .bind(5, int64_t{config.target_trials})
      .bind(6, to_json(config.space).dump())
      .bind(7, nlohmann::json(config.train_flags).dump())
      .bind(8, now_seconds())
      .run();
}

StudyConfig StudyStore::study() const {
  Statement query(db_, "SELECT direction, sampler, pruner, seed, target_trials, space, train_flags FROM studies");
  if (!query.step()) throw BadInput(path_.string() + ": the file holds no study yet");
  StudyConfig config;
  try {
    config.direction = direction_from(query.text(0));
  } catch (const UsageError&) {
    throw BadInput(path_.string() + ": the study's direction is damaged");
  }
  config.sampler = query.text(1);
  config.pruner = query.text(2);
  config.seed = static_cast<uint64_t>(query.integer(3));
  config.target_trials = static_cast<int>(query.integer(4));
  config.space = space_from_json(parse_json(query.text(5), "search space"));
  config.train_flags = parse_json(query.text(6), "train flags").get<std::vector<std::string>>();
  return config;
}

void StudyStore::set_target_trials(int trials) {
  Statement(db_, "UPDATE studies SET target_trials = ?").bind(1, int64_t{trials}).run();
}

std::vector<Trial> StudyStore::trials() const {
  std::vector<Trial> out;
  Statement query(db_, "SELECT number, state, params, value FROM trials ORDER BY number");
  while (query.step()) {
    Trial trial;
    trial.number = static_cast<int>(query.integer(0));
    trial.state = trial_state_from(query.text(1));
    trial.params = parse_json(query.text(2), "trial parameters");
    trial.value = query.optional<double>(3);
    out.push_back(std::move(trial));
  }
  Statement attempts(db_,
                     "SELECT t.number, a.attempt, a.state, a.command, a.batch, a.accumulate, a.device_index, "
                     "a.device, a.exit_code, a.signal, a.stderr_tail, a.peak_device_bytes, a.value, a.metrics, "
                     "a.intermediate, a.sweep_rss_bytes, a.started, a.finished "
                     "FROM attempts a JOIN trials t ON a.trial_id = t.id ORDER BY t.number, a.attempt");
  size_t next = 0;
  while (attempts.step()) {
    int number = static_cast<int>(attempts.integer(0));
    while (next < out.size() && out[next].number != number) ++next;
    if (next == out.size()) throw BadInput(path_.string() + ": an attempt without its trial");
    Attempt a;
    a.index = static_cast<int>(attempts.integer(1));
    a.state = trial_state_from(attempts.text(2));
    a.command = parse_json(attempts.text(3), "command").get<std::vector<std::string>>();
    a.batch = attempts.integer(4);
    a.accumulate = attempts.integer(5);
    a.device_index = static_cast<int>(attempts.integer(6));
    a.device = attempts.text(7);
    a.exit_code = attempts.optional<int>(8);
    a.signal = attempts.optional<int>(9);
    a.stderr_tail = attempts.text(10);
    a.peak_device_bytes = attempts.optional<uint64_t>(11);
    a.value = attempts.optional<double>(12);
    if (!attempts.is_null(13)) a.metrics = parse_json(attempts.text(13), "metrics");
    for (auto& pair : parse_json(attempts.text(14), "intermediate values"))
      a.intermediate.emplace_back(pair.at(0).get<int64_t>(), pair.at(1).get<double>());
    a.sweep_rss_bytes = static_cast<uint64_t>(attempts.integer(15));
    a.started = attempts.real(16);
    a.finished = attempts.real(17);
    out[next].attempts.push_back(std::move(a));
  }
  return out;
}

int StudyStore::mark_interrupted() {
  Transaction transaction(db_);
  Statement(db_, "UPDATE attempts SET state = 'interrupted', finished = ? WHERE state = 'running'")
      .bind(1, now_seconds())
      .run();
  Statement(db_, "UPDATE trials SET state = 'interrupted' WHERE state = 'running'").run();
  int changed = sqlite3_changes(db_);
  transaction.commit();
  return changed;
}

int64_t StudyStore::trial_id(int number) const {
  Statement query(db_, "SELECT id FROM trials WHERE study_id = 1 AND number = ?");
  query.bind(1, int64_t{number});
  if (!query.step()) throw Error(ExitCode::runtime_error, "study store: no trial " + std::to_string(number));
  return query.integer(0);
}

void StudyStore::add_trial(int number, const nlohmann::json& params) {
  Statement(db_, "INSERT INTO trials(study_id, number, state, params) VALUES (1, ?, 'running', ?)")
      .bind(1, int64_t{number})
      .bind(2, params.dump())
      .run();
}

void StudyStore::start_attempt(int number, const Attempt& attempt) {
  Transaction transaction(db_);
  int64_t id = trial_id(number);
  Statement(db_,
            "INSERT INTO attempts(trial_id, attempt, state, command, batch, accumulate, device_index, "
            "intermediate, started) VALUES (?, ?, 'running', ?, ?, ?, ?, '[]', ?)")
      .bind(1, id)
      .bind(2, int64_t{attempt.index})
      .bind(3, nlohmann::json(attempt.command).dump())
      .bind(4, attempt.batch)
      .bind(5, attempt.accumulate)
      .bind(6, int64_t{attempt.device_index})
      .bind(7, attempt.started)
      .run();
  Statement(db_, "UPDATE trials SET state = 'running' WHERE id = ?").bind(1, id).run();
  transaction.commit();
}

void StudyStore::record_intermediate(int number, const Attempt& attempt) {
  Statement(db_, "UPDATE attempts SET intermediate = ? WHERE trial_id = ? AND attempt = ?")
      .bind(1, intermediate_json(attempt).dump())
      .bind(2, trial_id(number))
      .bind(3, int64_t{attempt.index})
      .run();
}

void StudyStore::finish_attempt(int number, const Attempt& attempt, TrialState trial_state,
                                std::optional<double> trial_value) {
  Transaction transaction(db_);
  int64_t id = trial_id(number);
  Statement(db_,
            "UPDATE attempts SET state = ?, device = ?, exit_code = ?, signal = ?, stderr_tail = ?, "
            "peak_device_bytes = ?, value = ?, metrics = ?, intermediate = ?, sweep_rss_bytes = ?, finished = ? "
            "WHERE trial_id = ? AND attempt = ?")
      .bind(1, std::string(to_string(attempt.state)))
      .bind(2, attempt.device)
      .bind(3, attempt.exit_code)
      .bind(4, attempt.signal)
      .bind(5, attempt.stderr_tail)
      .bind(6, attempt.peak_device_bytes)
      .bind(7, attempt.value)
      .bind(8, attempt.metrics.is_null() ? std::string("null") : attempt.metrics.dump())
      .bind(9, intermediate_json(attempt).dump())
      .bind(10, static_cast<int64_t>(attempt.sweep_rss_bytes))
      .bind(11, attempt.finished)
      .bind(12, id)
      .bind(13, int64_t{attempt.index})
      .run();
  Statement(db_, "UPDATE trials SET state = ?, value = ? WHERE id = ?")
      .bind(1, std::string(to_string(trial_state)))
      .bind(2, trial_value)
      .bind(3, id)
      .run();
  transaction.commit();
}

}  // namespace tessera::sweep
