#include "sweep/store.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/error.h"
#include "common/json_input.h"
#include "sweep/database.h"

namespace tessera::sweep {

namespace {

// Written to the format table; a database without it is not a study. Version 2 added the
// objective, workers, heartbeats and what each trial's sampler saw.
constexpr int format_version = 2;

// {id} {int} {real} become each database's column types.
const char* schema = R"sql(
CREATE TABLE tessera_study_format(version {int} NOT NULL);
CREATE TABLE studies(
  id {id}, direction TEXT NOT NULL, objective TEXT NOT NULL, sampler TEXT NOT NULL, pruner TEXT NOT NULL,
  seed {int} NOT NULL, target_trials {int} NOT NULL, space TEXT NOT NULL, train_flags TEXT NOT NULL,
  created {real} NOT NULL);
CREATE TABLE trials(
  id {id}, study_id {int} NOT NULL REFERENCES studies(id), number {int} NOT NULL,
  state TEXT NOT NULL, params TEXT NOT NULL, value {real}, worker TEXT, heartbeat {real},
  sampler_saw TEXT NOT NULL, UNIQUE(study_id, number));
CREATE TABLE attempts(
  id {id}, trial_id {int} NOT NULL REFERENCES trials(id), attempt {int} NOT NULL,
  state TEXT NOT NULL, command TEXT NOT NULL, batch {int}, accumulate {int}, device_index {int},
  device TEXT, exit_code {int}, signal {int}, stderr_tail TEXT, peak_device_bytes {int}, value {real},
  metrics TEXT, intermediate TEXT NOT NULL, sweep_rss_bytes {int}, worker TEXT, started {real} NOT NULL,
  finished {real}, UNIQUE(trial_id, attempt));
)sql";

nlohmann::json parse_json(const std::string& text, const char* what) {
  return parse_json_input(text, std::string("the study's ") + what + " (damaged)");
}

// Non-finite values are null in JSON, and read back as NaN.
nlohmann::json intermediate_json(const Attempt& attempt) {
  nlohmann::json out = nlohmann::json::array();
  for (auto& [step, value] : attempt.intermediate)
    out.push_back({step, std::isfinite(value) ? nlohmann::json(value) : nlohmann::json()});
  return out;
}

double number_or_nan(const nlohmann::json& value) {
  return value.is_number() ? value.get<double>() : std::numeric_limits<double>::quiet_NaN();
}

SqlValue optional_value(std::optional<double> value) {
  return value ? SqlValue(*value) : SqlValue();
}
SqlValue optional_value(std::optional<int> value) {
  return value ? SqlValue(int64_t{*value}) : SqlValue();
}
SqlValue optional_value(std::optional<uint64_t> value) {
  return value ? SqlValue(static_cast<int64_t>(*value)) : SqlValue();
}

std::string joined(const std::vector<std::string>& tokens) {
  std::string out;
  for (auto& token : tokens) out += (out.empty() ? "" : " ") + token;
  return "'" + out + "'";
}

}  // namespace

std::vector<std::string> setting_differences(const StudyConfig& study, const StudyConfig& here) {
  std::vector<std::string> out;
  auto compare = [&](const std::string& what, const std::string& in_study, const std::string& given) {
    if (in_study != given) out.push_back(what + ": " + in_study + " in the study, " + given + " here");
  };
  for (auto& param : study.space) {
    auto found = std::find_if(here.space.begin(), here.space.end(), [&](auto& p) { return p.name == param.name; });
    if (found == here.space.end()) out.push_back("--param " + param.name + ": in the study, not here");
    else compare("--param " + param.name, spec_text(param), spec_text(*found));
  }
  for (auto& param : here.space)
    if (std::none_of(study.space.begin(), study.space.end(), [&](auto& p) { return p.name == param.name; }))
      out.push_back("--param " + param.name + ": here, not in the study");
  compare("--objective", study.objective, here.objective);
  compare("--direction", std::string(to_string(study.direction)), std::string(to_string(here.direction)));
  compare("--sampler", study.sampler, here.sampler);
  compare("--pruner", study.pruner, here.pruner);
  compare("--seed", std::to_string(study.seed), std::to_string(here.seed));
  compare("train flags after --", joined(study.train_flags), joined(here.train_flags));
  return out;
}

StudyStore::StudyStore(const std::string& location, Mode mode)
    : database_(open_database(location, mode == Mode::read_only)) {
  initialize(mode);
}

StudyStore::~StudyStore() = default;

const std::string& StudyStore::name() const { return database_->name(); }
bool StudyStore::is_shared() const { return database_->is_postgres(); }

void StudyStore::initialize(Mode mode) {
  auto not_a_study = [&](const std::string& why) {
    return BadInput(name() + " is not a tessera study (" + why + ")");
  };
  try {
    Transaction transaction(*database_, mode == Mode::read_only ? Transaction::Kind::reads : Transaction::Kind::writes);
    // Workers starting at once on an empty database create the tables once.
    if (database_->is_postgres() && mode == Mode::read_write) database_->query("SELECT pg_advisory_xact_lock(7370737)");
    auto tables = database_->tables();
    bool has_format = std::find(tables.begin(), tables.end(), "tessera_study_format") != tables.end();
    if (!tables.empty() && !has_format) throw not_a_study("a database without tessera's tables");
    if (tables.empty() && mode == Mode::read_only) throw not_a_study("an empty database");
    if (tables.empty()) {
      database_->execute_script(database_->schema(schema));
      database_->query("INSERT INTO tessera_study_format(version) VALUES (?)", {int64_t{format_version}});
    }
    transaction.commit();
  } catch (const BadInput&) {
    throw;
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    // The first read of the file's contents: SQLite says "file is not a database".
    if (database_->is_postgres()) throw;
    throw not_a_study(e.what());
  }
  if (!database_->is_postgres() && mode == Mode::read_write) {
    database_->execute_script("PRAGMA journal_mode = WAL");
    database_->execute_script("PRAGMA synchronous = NORMAL");
    database_->execute_script("PRAGMA foreign_keys = ON");
  }
  auto version = database_->query("SELECT version FROM tessera_study_format").rows;
  if (!version.empty() && version[0].integer(0) == 1 && !database_->is_postgres()) {
    if (mode == Mode::read_only)
      throw BadInput(name() + ": a study of an older tessera; run the sweep on it once (e.g. --resume) to upgrade it");
    upgrade_from_version_1();
    return;
  }
  if (version.empty() || version[0].integer(0) != format_version)
    throw not_a_study("a study format this tessera does not read");
}

// Version 1 (SQLite only) lacked the objective, workers, heartbeats and sampler records.
void StudyStore::upgrade_from_version_1() {
  Transaction transaction(*database_);
  database_->execute_script(
      "ALTER TABLE studies ADD COLUMN objective TEXT NOT NULL DEFAULT 'val_loss';"
      "ALTER TABLE trials ADD COLUMN worker TEXT;"
      "ALTER TABLE trials ADD COLUMN heartbeat REAL;"
      "ALTER TABLE trials ADD COLUMN sampler_saw TEXT NOT NULL DEFAULT '[]';"
      "ALTER TABLE attempts ADD COLUMN worker TEXT;");
  database_->query("UPDATE tessera_study_format SET version = ?", {int64_t{format_version}});
  transaction.commit();
}

bool StudyStore::has_study() { return database_->query("SELECT COUNT(*) FROM studies").rows.at(0).integer(0) > 0; }

StudyConfig StudyStore::create_or_load(const StudyConfig& config) {
  Transaction transaction(*database_);
  database_->query(
      "INSERT INTO studies(id, direction, objective, sampler, pruner, seed, target_trials, space, train_flags, created) "
      "VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, " + std::string(database_->now_sql()) + ") ON CONFLICT (id) DO NOTHING",
      {std::string(to_string(config.direction)), config.objective, config.sampler, config.pruner,
       static_cast<int64_t>(config.seed), int64_t{config.target_trials}, to_json(config.space).dump(),
       nlohmann::json(config.train_flags).dump()});
  auto stored = study();
  transaction.commit();
  return stored;
}

StudyConfig StudyStore::study() {
  auto rows = database_->query(
                           "SELECT direction, objective, sampler, pruner, seed, target_trials, space, train_flags "
                           "FROM studies WHERE id = 1")
                  .rows;
  if (rows.empty()) throw BadInput(name() + ": holds no study yet");
  auto& row = rows[0];
  StudyConfig config;
  try {
    config.direction = direction_from(row.text(0));
  } catch (const UsageError&) {
    throw BadInput(name() + ": the study's direction is damaged");
  }
  config.objective = row.text(1);
  config.sampler = row.text(2);
  config.pruner = row.text(3);
  config.seed = static_cast<uint64_t>(row.integer(4));
  config.target_trials = static_cast<int>(row.integer(5));
  config.space = space_from_json(parse_json(row.text(6), "search space"));
  config.train_flags = parse_json(row.text(7), "train flags").get<std::vector<std::string>>();
  return config;
}

void StudyStore::raise_target_trials(int trials) {
  database_->query("UPDATE studies SET target_trials = ? WHERE id = 1 AND target_trials < ?",
                   {int64_t{trials}, int64_t{trials}});
}

std::vector<Trial> StudyStore::trials() {
  Transaction transaction(*database_, Transaction::Kind::reads);  // one snapshot of trials and attempts
  auto out = load_trials();
  transaction.commit();
  // A study file that no sweep writes has nothing running: its sweep died (SIGKILL, power).
  if (!database_->writer_running())
    for (auto& trial : out) {
      if (trial.state == TrialState::running) trial.state = TrialState::interrupted;
      for (auto& attempt : trial.attempts)
        if (attempt.state == TrialState::running) attempt.state = TrialState::interrupted;
    }
  return out;
}

std::vector<Trial> StudyStore::load_trials() {
  std::vector<Trial> out;
  for (auto& row :
       database_->query("SELECT number, state, params, value, sampler_saw, " + std::string(database_->now_sql()) +
                        " - heartbeat FROM trials WHERE study_id = 1 ORDER BY number").rows) {
    Trial trial;
    trial.number = static_cast<int>(row.integer(0));
    trial.state = trial_state_from(row.text(1));
    trial.params = parse_json(row.text(2), "trial parameters");
    trial.value = row.optional<double>(3);
    trial.sampler_saw = parse_json(row.text(4), "sampler record").get<std::vector<int>>();
    if (trial.state == TrialState::running) trial.heartbeat_age = row.optional<double>(5);
    out.push_back(std::move(trial));
  }
  auto attempts = database_->query(
      "SELECT t.number, a.attempt, a.state, a.command, a.batch, a.accumulate, a.device_index, "
      "a.device, a.exit_code, a.signal, a.stderr_tail, a.peak_device_bytes, a.value, a.metrics, "
      "a.intermediate, a.sweep_rss_bytes, a.worker, a.started, a.finished "
      "FROM attempts a JOIN trials t ON a.trial_id = t.id WHERE t.study_id = 1 ORDER BY t.number, a.attempt");
  size_t next = 0;
  for (auto& row : attempts.rows) {
    int number = static_cast<int>(row.integer(0));
    while (next < out.size() && out[next].number != number) ++next;
    if (next == out.size()) throw BadInput(name() + ": an attempt without its trial");
    Attempt a;
    a.index = static_cast<int>(row.integer(1));
    a.state = trial_state_from(row.text(2));
    a.command = parse_json(row.text(3), "command").get<std::vector<std::string>>();
    a.batch = row.is_null(4) ? 0 : row.integer(4);
    a.accumulate = row.is_null(5) ? 0 : row.integer(5);
    a.device_index = row.is_null(6) ? -1 : static_cast<int>(row.integer(6));
    a.device = row.text(7);
    a.exit_code = row.optional<int>(8);
    a.signal = row.optional<int>(9);
    a.stderr_tail = row.text(10);
    a.peak_device_bytes = row.optional<uint64_t>(11);
    a.value = row.optional<double>(12);
    if (!row.is_null(13)) a.metrics = parse_json(row.text(13), "metrics");
    for (auto& pair : parse_json(row.text(14), "intermediate values")) {
      if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number_integer())
        throw BadInput(name() + ": the study's intermediate values are damaged");
      a.intermediate.emplace_back(pair[0].get<int64_t>(), number_or_nan(pair[1]));
    }
    a.sweep_rss_bytes = row.is_null(15) ? 0 : static_cast<uint64_t>(row.integer(15));
    a.worker = row.text(16);
    a.started = row.real(17);
    a.finished = row.is_null(18) ? 0 : row.real(18);
    out[next].attempts.push_back(std::move(a));
  }
  return out;
}

int StudyStore::mark_interrupted() {
  Transaction transaction(*database_);
  std::string now(database_->now_sql());
  database_->query("UPDATE attempts SET state = 'interrupted', finished = " + now + " WHERE state = 'running'");
  auto changed = database_->query("UPDATE trials SET state = 'interrupted', worker = NULL WHERE state = 'running'").changed;
  transaction.commit();
  return static_cast<int>(changed);
}

std::optional<StudyStore::Claim> StudyStore::claim_trial(const std::string& worker, double grace_seconds,
                                                         std::optional<size_t> capacity, const Sample& sample) {
  Transaction transaction(*database_);
  std::string now(database_->now_sql());
  // The study's row lock orders the claims of all workers (SQLite's BEGIN IMMEDIATE already has).
  auto study = database_->query(std::string("SELECT target_trials FROM studies WHERE id = 1") +
                                (database_->is_postgres() ? " FOR UPDATE" : ""));
  if (study.rows.empty()) throw BadInput(name() + ": holds no study");
  auto target = static_cast<size_t>(study.rows[0].integer(0));
  if (capacity) target = std::min(target, *capacity);
  std::string stale = "study_id = 1 AND state = 'running' AND (heartbeat IS NULL OR heartbeat < " + now + " - ?)";
  database_->query("UPDATE attempts SET state = 'interrupted', finished = " + now +
                       " WHERE state = 'running' AND trial_id IN (SELECT id FROM trials WHERE " + stale + ")",
                   {grace_seconds});
  database_->query("UPDATE trials SET state = 'interrupted', worker = NULL WHERE " + stale, {grace_seconds});
  auto interrupted = database_->query(
      "SELECT number FROM trials WHERE study_id = 1 AND state = 'interrupted' ORDER BY number LIMIT 1");
  std::optional<Claim> claim;
  if (!interrupted.rows.empty()) {
    claim = Claim{static_cast<int>(interrupted.rows[0].integer(0)), {}};
    database_->query("UPDATE trials SET state = 'running', worker = ?, heartbeat = " + now +
                         " WHERE study_id = 1 AND number = ?",
                     {worker, int64_t{claim->number}});
    claim->trials = load_trials();
  } else {
    auto trials = load_trials();
    if (trials.size() < target) {
      int number = static_cast<int>(trials.size());
      nlohmann::json saw = nlohmann::json::array();
      for (auto& trial : trials)
        if (is_finished(trial.state)) saw.push_back(trial.number);
      auto params = sample(number, trials);
      database_->query("INSERT INTO trials(study_id, number, state, params, worker, heartbeat, sampler_saw) "
                       "VALUES (1, ?, 'running', ?, ?, " + now + ", ?)",
                       {int64_t{number}, params.dump(), worker, saw.dump()});
      Trial trial;
      trial.number = number;
      trial.params = std::move(params);
      trial.sampler_saw = saw.get<std::vector<int>>();
      trials.push_back(std::move(trial));
      claim = Claim{number, std::move(trials)};
    }
  }
  transaction.commit();
  return claim;
}

int StudyStore::unfinished_trials() {
  return static_cast<int>(
      database_->query("SELECT COUNT(*) FROM trials WHERE study_id = 1 AND state IN ('running', 'interrupted')")
          .rows.at(0)
          .integer(0));
}

int64_t StudyStore::heartbeat(const std::string& worker) {
  return database_
      ->query("UPDATE trials SET heartbeat = " + std::string(database_->now_sql()) +
                  " WHERE study_id = 1 AND worker = ? AND state = 'running'",
              {worker})
      .changed;
}

int64_t StudyStore::trial_id(int number) {
  auto rows = database_->query("SELECT id FROM trials WHERE study_id = 1 AND number = ?", {int64_t{number}}).rows;
  if (rows.empty()) throw Error(ExitCode::runtime_error, name() + ": no trial " + std::to_string(number));
  return rows[0].integer(0);
}

void StudyStore::start_attempt(int number, const Attempt& attempt) {
  Transaction transaction(*database_);
  int64_t id = trial_id(number);
  database_->query(
      "INSERT INTO attempts(trial_id, attempt, state, command, batch, accumulate, device_index, intermediate, "
      "worker, started) VALUES (?, ?, 'running', ?, ?, ?, ?, '[]', ?, ?)",
      {id, int64_t{attempt.index}, nlohmann::json(attempt.command).dump(), attempt.batch, attempt.accumulate,
       int64_t{attempt.device_index}, attempt.worker, attempt.started});
  database_->query("UPDATE trials SET state = 'running', worker = ?, heartbeat = " +
                       std::string(database_->now_sql()) + " WHERE id = ?",
                   {attempt.worker, id});
  transaction.commit();
}

void StudyStore::record_intermediate(int number, const Attempt& attempt) {
  Transaction transaction(*database_);
  database_->query("UPDATE attempts SET intermediate = ? WHERE trial_id = ? AND attempt = ?",
                   {intermediate_json(attempt).dump(), trial_id(number), int64_t{attempt.index}});
  transaction.commit();
}

bool StudyStore::finish_attempt(int number, const Attempt& attempt, TrialState trial_state,
                                std::optional<double> trial_value) {
  Transaction transaction(*database_);
  int64_t id = trial_id(number);
  bool owned = database_
                   ->query("UPDATE trials SET state = ?, value = ? WHERE id = ? AND worker = ? AND state = 'running'",
                           {std::string(to_string(trial_state)), optional_value(trial_value), id, attempt.worker})
                   .changed == 1;
  auto state = owned ? attempt.state : TrialState::interrupted;
  database_->query(
      "UPDATE attempts SET state = ?, batch = ?, accumulate = ?, device = ?, exit_code = ?, signal = ?, "
      "stderr_tail = ?, peak_device_bytes = ?, value = ?, metrics = ?, intermediate = ?, sweep_rss_bytes = ?, "
      "finished = ? WHERE trial_id = ? AND attempt = ?",
      {std::string(to_string(state)), attempt.batch, attempt.accumulate, attempt.device, optional_value(attempt.exit_code),
       optional_value(attempt.signal), attempt.stderr_tail, optional_value(attempt.peak_device_bytes),
       optional_value(attempt.value), attempt.metrics.is_null() ? std::string("null") : attempt.metrics.dump(),
       intermediate_json(attempt).dump(), static_cast<int64_t>(attempt.sweep_rss_bytes), attempt.finished, id,
       int64_t{attempt.index}});
  transaction.commit();
  return owned;
}

void StudyStore::release(const std::string& worker) {
  Transaction transaction(*database_);
  std::string now(database_->now_sql());
  database_->query("UPDATE attempts SET state = 'interrupted', finished = " + now +
                       " WHERE state = 'running' AND worker = ?",
                   {worker});
  database_->query("UPDATE trials SET state = 'interrupted', worker = NULL WHERE state = 'running' AND worker = ?",
                   {worker});
  transaction.commit();
}

}  // namespace tessera::sweep
