// The sweep's parts without child processes: search space, samplers, pruners, study store, reports.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <set>

#include "common/error.h"
#include "sweep/pruner.h"
#include "sweep/report.h"
#include "sweep/sampler.h"
#include "sweep/store.h"
#include "sweep/train_flags.h"

namespace tessera::sweep {
namespace {

// A fresh path in this process's scratch directory, which is removed when the process ends.
std::filesystem::path temporary_path(const std::string& name) {
  struct Scratch {
    std::filesystem::path path =
        std::filesystem::temp_directory_path() / ("tessera_sweep_core_" + std::to_string(getpid()));
    ~Scratch() { std::filesystem::remove_all(path); }
  };
  static Scratch scratch;
  std::filesystem::create_directories(scratch.path);
  auto path = scratch.path / name;
  std::filesystem::remove(path);
  std::filesystem::remove(path.string() + "-wal");
  std::filesystem::remove(path.string() + "-shm");
  return path;
}

Trial finished_trial(int number, TrialState state, std::optional<double> value,
                     std::vector<std::pair<int64_t, double>> intermediate = {}) {
  Trial trial;
  trial.number = number;
  trial.state = state;
  trial.value = value;
  Attempt attempt;
  attempt.state = state;
  attempt.value = value;
  attempt.intermediate = std::move(intermediate);
  trial.attempts.push_back(attempt);
  return trial;
}

TEST(SweepSpace, ParsesEveryDistribution) {
  auto space = parse_space({"lr=loguniform:1e-4:1e-1", "momentum=uniform:0:0.99", "width=int:8:64",
                            "batch=choice:16,32,64", "optimizer=choice:sgd,adam", "env:TESSERA_FAULT=choice:,nan,leak:1MiB",
                            "epochs=logint:1:16"});
  ASSERT_EQ(space.size(), 7u);
  EXPECT_EQ(space[0].distribution, Distribution::log_uniform);
  EXPECT_DOUBLE_EQ(space[0].low, 1e-4);
  EXPECT_DOUBLE_EQ(space[0].high, 0.1);
  EXPECT_EQ(space[0].target(), "--lr");
  EXPECT_EQ(space[2].distribution, Distribution::integer);
  EXPECT_EQ(space[3].choices, (std::vector<nlohmann::json>{16, 32, 64}));
  EXPECT_TRUE(space[3].choices[0].is_number_integer());
  EXPECT_EQ(space[4].choices[1], "adam");
  EXPECT_TRUE(space[5].is_environment());
  EXPECT_EQ(space[5].target(), "TESSERA_FAULT");
  EXPECT_EQ(space[5].choices, (std::vector<nlohmann::json>{"", "nan", "leak:1MiB"}));
  EXPECT_EQ(space[6].distribution, Distribution::log_integer);
  EXPECT_EQ(space_from_json(to_json(space)).size(), 7u);
  EXPECT_EQ(to_json(space_from_json(to_json(space))), to_json(space));
}

TEST(SweepSpace, RejectsMalformedParams) {
  for (const char* bad : {"lr", "lr=", "lr=loguniform", "lr=loguniform:0:1", "lr=uniform:1:1", "lr=uniform:a:b",
                          "lr=gauss:0:1", "width=int:8.5:64", "width=int:64:8", "batch=choice:", "batch=choice:1,,2",
                          "batch=choice:1,1", "--lr=uniform:0:1", "=uniform:0:1", "env:=choice:a"}) {
    try {
      parse_param(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--param"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(parse_space({"lr=uniform:0:1", "lr=uniform:0:2"}), UsageError);
}

TEST(SweepSpace, InternalAxisRoundTripsAndValuesPrintExactly) {
  auto lr = parse_param("lr=loguniform:1e-4:1e-1");
  EXPECT_NEAR(to_internal(lr, 0.01), std::log(0.01), 1e-12);
  EXPECT_DOUBLE_EQ(from_internal(lr, std::log(0.01)).get<double>(), 0.01);
  EXPECT_DOUBLE_EQ(from_internal(lr, 100.0).get<double>(), 0.1);  // clamped
  auto width = parse_param("width=int:8:64");
  EXPECT_EQ(from_internal(width, 8.4).get<int64_t>(), 8);
  EXPECT_EQ(from_internal(width, 63.6).get<int64_t>(), 64);
  auto batch = parse_param("batch=choice:16,32,64");
  EXPECT_EQ(from_internal(batch, 1.2), 32);
  EXPECT_EQ(to_internal(batch, 64), 2.0);
  EXPECT_EQ(value_text(0.1), "0.1");
  EXPECT_EQ(value_text(0.00123456789), "0.00123456789");
  EXPECT_EQ(value_text(32), "32");
  EXPECT_EQ(value_text("adam"), "adam");
  EXPECT_EQ(std::stod(value_text(1.0 / 3.0)), 1.0 / 3.0);
}

TEST(SweepSpace, TrainFlagsAreCheckedAgainstTrainsFlags) {
  TrainFlags known;
  known.names = {"-h", "--help", "--data", "--batch", "--lr", "--device", "--report-fd", "--dry-run", "--checkpoint"};
  known.defaults = {{"--batch", "64"}};
  auto space = parse_space({"lr=loguniform:1e-4:1e-1"});
  EXPECT_NO_THROW(check_train_flags(known, {"--data", "p.h5", "--batch=8", "--dry-run"}, space, false, 4));
  EXPECT_NO_THROW(check_train_flags(known, {"--data", "-1"}, space, false, 4));
  EXPECT_THROW(check_train_flags(known, {"--data", "p.h5", "--bogus", "1"}, space, false, 4), UsageError);
  EXPECT_THROW(check_train_flags(known, {"--lr", "0.1"}, space, false, 4), UsageError);
  EXPECT_THROW(check_train_flags(known, {"--report-fd", "5"}, space, false, 4), UsageError);
  EXPECT_THROW(check_train_flags(known, {"--device", "0"}, space, true, 4), UsageError);
  EXPECT_NO_THROW(check_train_flags(known, {"--device", "0"}, space, false, 4));
  EXPECT_THROW(check_train_flags(known, {}, parse_space({"widht=int:8:64"}), false, 4), UsageError);
  EXPECT_NO_THROW(check_train_flags(known, {}, parse_space({"env:TESSERA_FAULT=choice:nan"}), false, 4));
  // One checkpoint for every trial only with {trial} in it, or with one trial.
  EXPECT_THROW(check_train_flags(known, {"--checkpoint", "c.h5"}, space, false, 4), UsageError);
  EXPECT_NO_THROW(check_train_flags(known, {"--checkpoint", "c.h5"}, space, false, 1));
  EXPECT_NO_THROW(check_train_flags(known, {"--checkpoint", "runs/{trial}.h5"}, space, false, 4));
  EXPECT_EQ(with_trial_number({"--checkpoint", "runs/{trial}/c{trial}.h5", "--lr"}, 7),
            (std::vector<std::string>{"--checkpoint", "runs/7/c7.h5", "--lr"}));

  std::vector<std::string> tokens = {"--data", "p.h5", "--batch=8"};
  EXPECT_EQ(flag_value(tokens, "--batch"), "8");
  EXPECT_EQ(flag_value(tokens, "--accumulate"), std::nullopt);
  set_flag(tokens, "--batch", "4");
  set_flag(tokens, "--accumulate", "2");
  EXPECT_EQ(tokens, (std::vector<std::string>{"--data", "p.h5", "--batch=4", "--accumulate", "2"}));
}

TEST(SweepSampler, GridVisitsEveryCombinationOnce) {
  auto space = parse_space({"batch=choice:16,32", "width=int:1:3", "optimizer=choice:sgd,adam"});
  auto grid = make_sampler("grid", space, Direction::minimize, 0);
  ASSERT_EQ(grid->capacity(), 12u);
  std::set<std::string> seen;
  for (int n = 0; n < 12; ++n) seen.insert(grid->sample(n, {}).dump());
  EXPECT_EQ(seen.size(), 12u);
  EXPECT_THROW(make_sampler("grid", parse_space({"lr=uniform:0:1"}), Direction::minimize, 0), UsageError);
  EXPECT_THROW(make_sampler("grid", {}, Direction::minimize, 0), UsageError);
  EXPECT_THROW(make_sampler("bayes", space, Direction::minimize, 0), UsageError);
}

TEST(SweepSampler, RandomStaysInBoundsAndRepeatsWithItsSeed) {
  auto space = parse_space({"lr=loguniform:1e-4:1e-1", "width=logint:2:64", "opt=choice:a,b,c"});
  auto sampler = make_sampler("random", space, Direction::minimize, 7);
  std::set<std::string> optimizers;
  double below_1e3 = 0;
  for (int n = 0; n < 400; ++n) {
    auto params = sampler->sample(n, {});
    double lr = params["lr"].get<double>();
    ASSERT_GE(lr, 1e-4);
    ASSERT_LE(lr, 1e-1);
    below_1e3 += lr < 1e-3;
    int64_t width = params["width"].get<int64_t>();
    ASSERT_GE(width, 2);
    ASSERT_LE(width, 64);
    optimizers.insert(params["opt"].get<std::string>());
  }
  // Log-uniform: a third of the draws fall in the lowest decade of three.
  EXPECT_NEAR(below_1e3 / 400, 1.0 / 3.0, 0.08);
  EXPECT_EQ(optimizers.size(), 3u);
  EXPECT_EQ(sampler->sample(5, {}), make_sampler("random", space, Direction::minimize, 7)->sample(5, {}));
  EXPECT_NE(sampler->sample(5, {}), make_sampler("random", space, Direction::minimize, 8)->sample(5, {}));
}

// A synthetic objective with its optimum at lr = 10^-2.5, x = 1.3, opt = c (value 0 there).
double synthetic_objective(const nlohmann::json& params) {
  double lr = params["lr"].get<double>(), x = params["x"].get<double>();
  return std::pow(std::log10(lr) + 2.5, 2) + 0.5 * std::pow(x - 1.3, 2) + (params["opt"] == "c" ? 0.0 : 1.0);
}

double best_found(const std::string& sampler_name, uint64_t seed, int trials, Direction direction = Direction::minimize) {
  auto space = parse_space({"lr=loguniform:1e-6:1", "x=uniform:-5:5", "opt=choice:a,b,c,d"});
  auto sampler = make_sampler(sampler_name, space, direction, seed);
  std::vector<Trial> history;
  double best = INFINITY;
  for (int n = 0; n < trials; ++n) {
    Trial trial;
    trial.number = n;
    trial.params = sampler->sample(n, history);
    double value = synthetic_objective(trial.params);
    trial.value = direction == Direction::minimize ? value : -value;
    trial.state = TrialState::complete;
    history.push_back(trial);
    best = std::min(best, value);
  }
  return best;
}

TEST(SweepSampler, TpeBeatsRandomSearchOnAKnownOptimum) {
  const int seeds = 12, trials = 60;
  double tpe_total = 0, random_total = 0;
  int tpe_wins = 0;
  for (uint64_t seed = 0; seed < seeds; ++seed) {
    double tpe = best_found("tpe", seed, trials), random = best_found("random", seed, trials);
    tpe_total += tpe;
    random_total += random;
    tpe_wins += tpe < random;
  }
  std::printf("mean best of %d trials over %d seeds: tpe %.4f, random %.4f; tpe better in %d\n", trials, seeds,
              tpe_total / seeds, random_total / seeds, tpe_wins);
  EXPECT_LT(tpe_total, 0.6 * random_total);
  EXPECT_GE(tpe_wins, 8);
  // Maximizing the negated objective is the same search.
  EXPECT_NEAR(best_found("tpe", 3, trials, Direction::maximize), best_found("tpe", 3, trials), 1e-12);
}

TEST(SweepSampler, TpeLearnsFromDivergedAndPrunedTrials) {
  // Large learning rates diverge; TPE should stop proposing them.
  auto space = parse_space({"lr=loguniform:1e-5:1"});
  auto sampler = make_sampler("tpe", space, Direction::minimize, 1);
  std::vector<Trial> history;
  int late_large = 0;
  for (int n = 0; n < 50; ++n) {
    Trial trial;
    trial.number = n;
    trial.params = sampler->sample(n, history);
    double lr = trial.params["lr"].get<double>();
    if (lr > 1e-2) trial.state = TrialState::diverged;
    else {
      trial.state = TrialState::complete;
      trial.value = std::abs(std::log10(lr) + 3);
    }
    if (n >= 30) late_large += lr > 1e-2;
    history.push_back(trial);
  }
  EXPECT_LE(late_large, 4);
}

TEST(SweepPruner, MedianStopsATrialWorseThanTheMedianAtItsStep) {
  std::vector<Trial> trials;
  for (int n = 0; n < 5; ++n)
    trials.push_back(finished_trial(n, TrialState::complete, 1.0, {{1, 1.0 + 0.1 * n}, {2, 0.9}}));
  auto median = make_pruner("median", Direction::minimize);
  trials.push_back(finished_trial(5, TrialState::running, std::nullopt, {{1, 1.5}}));
  EXPECT_TRUE(median->should_prune(trials.back(), trials));  // median at step 1 is 1.2
  trials.back().attempts.back().intermediate = {{1, 1.1}};
  EXPECT_FALSE(median->should_prune(trials.back(), trials));
  // Fewer complete trials than the start-up count: never.
  std::vector<Trial> few(trials.begin() + 2, trials.end());
  few.back().attempts.back().intermediate = {{1, 5.0}};
  EXPECT_FALSE(median->should_prune(few.back(), few));
  auto maximizing = make_pruner("median", Direction::maximize);
  trials.back().attempts.back().intermediate = {{1, 1.1}};
  EXPECT_TRUE(maximizing->should_prune(trials.back(), trials));
  EXPECT_EQ(make_pruner("none", Direction::minimize), nullptr);
  EXPECT_THROW(make_pruner("hyperband", Direction::minimize), UsageError);
}

TEST(SweepPruner, AshaPromotesTheBestQuarterAtEachRung) {
  auto asha = make_pruner("asha", Direction::minimize);
  std::vector<Trial> trials;
  // Eight trials reached rung 1 (step 1) with values 0.1 ... 0.8.
  for (int n = 0; n < 8; ++n) trials.push_back(finished_trial(n, TrialState::complete, 0.1 * (n + 1), {{1, 0.1 * (n + 1)}}));
  // With itself, nine values at rung 1: the best 9/4 = 2 go on.
  trials.push_back(finished_trial(8, TrialState::running, std::nullopt, {{1, 0.15}}));
  EXPECT_FALSE(asha->should_prune(trials.back(), trials));
  trials.back().attempts.back().intermediate = {{1, 0.25}};
  EXPECT_TRUE(asha->should_prune(trials.back(), trials));
  // Between rungs (steps 2 and 3) nothing is decided; rung 2 is step 4.
  trials.back().attempts.back().intermediate = {{1, 0.15}, {2, 9.0}};
  EXPECT_FALSE(asha->should_prune(trials.back(), trials));
  trials.back().attempts.back().intermediate = {{1, 0.15}, {2, 9.0}, {3, 9.0}, {4, 0.5}};
  EXPECT_FALSE(asha->should_prune(trials.back(), trials));  // the first at rung 2 goes on
  trials.push_back(finished_trial(9, TrialState::running, std::nullopt, {{1, 0.12}, {4, 0.6}}));
  EXPECT_TRUE(asha->should_prune(trials.back(), trials));  // second at rung 2, worse than the first
}

TEST(SweepStore, KeepsTrialsAndAttemptsAcrossReopening) {
  auto path = temporary_path("study.sqlite");
  StudyConfig config;
  config.direction = Direction::maximize;
  config.sampler = "random";
  config.seed = 42;
  config.target_trials = 3;
  config.space = parse_space({"lr=loguniform:1e-4:1e-1", "batch=choice:16,32"});
  config.train_flags = {"--data", "patches.h5", "--epochs", "2"};
  auto sample_lr = [](double lr, int batch) {
    return [=](int, const std::vector<Trial>&) { return nlohmann::json{{"lr", lr}, {"batch", batch}}; };
  };
  {
    StudyStore store(path, StudyStore::Mode::read_write);
    EXPECT_FALSE(store.has_study());
    EXPECT_EQ(to_json(store.create_or_load(config).space), to_json(config.space));
    auto claim = store.claim_trial("w", 60, std::nullopt, sample_lr(0.01, 32));
    ASSERT_TRUE(claim);
    EXPECT_EQ(claim->number, 0);
    Attempt first;
    first.command = {"tessera", "train", "--batch", "32"};
    first.batch = 32;
    first.started = 100;
    first.worker = "w";
    store.start_attempt(0, first);
    first.state = TrialState::oom;
    first.exit_code = 3;
    first.stderr_tail = "out of device memory";
    first.finished = 101;
    EXPECT_TRUE(store.finish_attempt(0, first, TrialState::running, std::nullopt));
    Attempt second = first;
    second.index = 1;
    second.batch = 16;
    second.accumulate = 2;
    second.state = TrialState::running;
    store.start_attempt(0, second);
    second.intermediate = {{1, 0.5}, {2, 0.75}};
    store.record_intermediate(0, second);
    second.state = TrialState::complete;
    second.value = 0.75;
    second.peak_device_bytes = 123456;
    second.device = "llvmpipe";
    second.metrics = {{"accuracy", 0.75}};
    EXPECT_TRUE(store.finish_attempt(0, second, TrialState::complete, 0.75));
    ASSERT_TRUE(store.claim_trial("w", 60, std::nullopt, sample_lr(0.001, 16)));
    store.start_attempt(1, first);
    // The target is 3 and a grid of 2 caps it.
    EXPECT_FALSE(store.claim_trial("w", 60, size_t{2}, sample_lr(0.1, 16)));
  }
  StudyStore store(path, StudyStore::Mode::read_write);
  ASSERT_TRUE(store.has_study());
  auto loaded = store.study();
  EXPECT_EQ(loaded.direction, Direction::maximize);
  EXPECT_EQ(loaded.seed, 42u);
  EXPECT_EQ(loaded.train_flags, config.train_flags);
  // The same command with more trials grows the study; fewer never shrink it.
  store.raise_target_trials(5);
  store.raise_target_trials(2);
  EXPECT_EQ(store.study().target_trials, 5);
  EXPECT_EQ(to_json(loaded.space), to_json(config.space));
  EXPECT_EQ(store.mark_interrupted(), 1);
  auto trials = store.trials();
  ASSERT_EQ(trials.size(), 2u);
  EXPECT_EQ(trials[0].state, TrialState::complete);
  EXPECT_EQ(trials[0].value, 0.75);
  ASSERT_EQ(trials[0].attempts.size(), 2u);
  EXPECT_EQ(trials[0].attempts[0].state, TrialState::oom);
  EXPECT_EQ(trials[0].attempts[0].exit_code, 3);
  EXPECT_EQ(trials[0].attempts[1].batch, 16);
  EXPECT_EQ(trials[0].attempts[1].accumulate, 2);
  EXPECT_EQ(trials[0].attempts[1].peak_device_bytes, 123456u);
  EXPECT_EQ(trials[0].intermediate(), (std::vector<std::pair<int64_t, double>>{{1, 0.5}, {2, 0.75}}));
  EXPECT_EQ(trials[1].state, TrialState::interrupted);
  EXPECT_EQ(trials[1].attempts[0].state, TrialState::interrupted);
  EXPECT_EQ(trials[1].sampler_saw, std::vector<int>{0}) << "the sampler of trial 1 saw trial 0";
  // An interrupted trial is claimed before a new one.
  auto again = store.claim_trial("v", 60, std::nullopt, [](int, auto&) -> nlohmann::json { throw std::logic_error("sampled"); });
  ASSERT_TRUE(again);
  EXPECT_EQ(again->number, 1);

  auto csv = export_csv(trials, loaded);
  EXPECT_NE(csv.find("number,state,value,attempts"), std::string::npos);
  EXPECT_NE(csv.find("0,complete,0.75,2,"), std::string::npos) << csv;
  auto json = nlohmann::json::parse(export_json(trials, loaded));
  EXPECT_EQ(json["best"]["number"], 0);
  EXPECT_EQ(json["trials"][0]["attempts"][1]["intermediate"][1]["value"], 0.75);
  auto table = format_table(trials, loaded);
  EXPECT_NE(table.find("best flags: --lr 0.01 --batch 16 --accumulate 2"), std::string::npos) << table;
  auto html = export_html(trials, loaded, "study.sqlite");
  EXPECT_NE(html.find("data-rendered"), std::string::npos);
  EXPECT_EQ(html.find("http://"), html.find("http://www.w3.org/2000/svg")) << "no external resources";
  EXPECT_EQ(html.find("https://"), std::string::npos);
  auto svg = export_svg(trials, loaded);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("lr against the objective"), std::string::npos);
  EXPECT_NE(svg.find("batch against the objective"), std::string::npos);
}

TEST(SweepStore, ATrialWithNaNValuesStaysReadable) {
  auto path = temporary_path("nan.sqlite");
  StudyConfig config;
  config.target_trials = 2;
  config.space = parse_space({"lr=loguniform:1e-4:1e-1"});
  StudyStore store(path, StudyStore::Mode::read_write);
  store.create_or_load(config);
  ASSERT_TRUE(store.claim_trial("w", 60, std::nullopt, [](int, auto&) { return nlohmann::json{{"lr", 0.01}}; }));
  Attempt attempt;
  attempt.worker = "w";
  store.start_attempt(0, attempt);
  double nan = std::numeric_limits<double>::quiet_NaN();
  attempt.intermediate = {{1, 0.5}, {2, nan}};
  attempt.value = nan;
  attempt.metrics = {{"val_loss", nan}, {"val_accuracy", 0.5}};
  attempt.state = TrialState::diverged;
  ASSERT_TRUE(store.finish_attempt(0, attempt, TrialState::diverged, nan));
  auto trials = StudyStore(path, StudyStore::Mode::read_only).trials();
  ASSERT_EQ(trials.size(), 1u);
  ASSERT_EQ(trials[0].intermediate().size(), 2u);
  EXPECT_EQ(trials[0].intermediate()[0].second, 0.5);
  EXPECT_TRUE(std::isnan(trials[0].intermediate()[1].second));
  EXPECT_NE(format_table(trials, config).find("diverged"), std::string::npos);
  EXPECT_NO_THROW(nlohmann::json::parse(export_json(trials, config)));
  EXPECT_NO_THROW(export_csv(trials, config));
  EXPECT_NO_THROW(export_svg(trials, config));
}

TEST(SweepStore, OneWriterAtATimeOnAStudyFile) {
  auto path = temporary_path("locked.sqlite");
  StudyConfig config;
  config.target_trials = 1;
  config.space = parse_space({"lr=loguniform:1e-4:1e-1"});
  auto writer = std::make_unique<StudyStore>(path, StudyStore::Mode::read_write);
  writer->create_or_load(config);
  try {
    StudyStore second(path, StudyStore::Mode::read_write);
    ADD_FAILURE() << "a second writer opened the study";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("another sweep is running"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(StudyStore(path, StudyStore::Mode::read_only).trials()) << "readers need no lock";
  writer.reset();
  EXPECT_NO_THROW(StudyStore(path, StudyStore::Mode::read_write));
}

TEST(SweepStore, NamesEverySettingThatDiffers) {
  StudyConfig study;
  study.space = parse_space({"lr=loguniform:1e-4:1e-1", "width=int:4:16"});
  study.train_flags = {"--data", "p.h5"};
  StudyConfig here = study;
  here.target_trials = 50;
  EXPECT_TRUE(setting_differences(study, here).empty()) << "the trial count may grow";
  here.space = parse_space({"lr=loguniform:1e-3:1e-1", "momentum=uniform:0:0.9"});
  here.sampler = "random";
  here.objective = "val_accuracy";
  here.direction = Direction::maximize;
  here.train_flags = {"--data", "q.h5"};
  auto differences = setting_differences(study, here);
  std::string all;
  for (auto& d : differences) all += d + "\n";
  EXPECT_EQ(differences.size(), 7u) << all;
  for (const char* named : {"--param lr: loguniform:1e-04:0.1 in the study, loguniform:0.001:0.1 here",
                            "--param width: in the study, not here", "--param momentum: here, not in the study",
                            "--sampler: tpe in the study, random here", "--objective", "--direction",
                            "train flags after --: '--data p.h5' in the study, '--data q.h5' here"})
    EXPECT_NE(all.find(named), std::string::npos) << named << " in\n" << all;
}

TEST(SweepStore, UpgradesAStudyOfFormatOne) {
  auto path = temporary_path("v1.sqlite");
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  // The tables tessera wrote before studies had objectives, workers and heartbeats.
  const char* version_1 = R"sql(
    CREATE TABLE tessera_study_format(version INTEGER NOT NULL); INSERT INTO tessera_study_format VALUES (1);
    CREATE TABLE studies(id INTEGER PRIMARY KEY, direction TEXT NOT NULL, sampler TEXT NOT NULL, pruner TEXT NOT NULL,
      seed INTEGER NOT NULL, target_trials INTEGER NOT NULL, space TEXT NOT NULL, train_flags TEXT NOT NULL, created REAL NOT NULL);
    CREATE TABLE trials(id INTEGER PRIMARY KEY, study_id INTEGER NOT NULL REFERENCES studies(id), number INTEGER NOT NULL,
      state TEXT NOT NULL, params TEXT NOT NULL, value REAL, UNIQUE(study_id, number));
    CREATE TABLE attempts(id INTEGER PRIMARY KEY, trial_id INTEGER NOT NULL REFERENCES trials(id), attempt INTEGER NOT NULL,
      state TEXT NOT NULL, command TEXT NOT NULL, batch INTEGER, accumulate INTEGER, device_index INTEGER,
      device TEXT, exit_code INTEGER, signal INTEGER, stderr_tail TEXT, peak_device_bytes INTEGER, value REAL,
      metrics TEXT, intermediate TEXT NOT NULL, sweep_rss_bytes INTEGER, started REAL NOT NULL, finished REAL,
      UNIQUE(trial_id, attempt));
    INSERT INTO studies VALUES (1, 'minimize', 'tpe', 'none', 0, 2, '[{"name":"lr","distribution":"loguniform","low":0.001,"high":0.1}]', '["--data","p.h5"]', 0);
    INSERT INTO trials VALUES (1, 1, 0, 'complete', '{"lr":0.01}', 0.5);
    INSERT INTO attempts VALUES (1, 1, 0, 'complete', '["tessera","train"]', 0, 0, -1, 'llvmpipe', 0, NULL, '', 100, 0.5, 'null', '[[1,0.5]]', 1, 10, 11);
  )sql";
  ASSERT_EQ(sqlite3_exec(db, version_1, nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
  sqlite3_close(db);
  EXPECT_THROW(StudyStore(path, StudyStore::Mode::read_only), BadInput) << "a reader does not change the file";
  StudyStore store(path, StudyStore::Mode::read_write);
  EXPECT_EQ(store.study().objective, "val_loss");
  auto trials = store.trials();
  ASSERT_EQ(trials.size(), 1u);
  EXPECT_EQ(trials[0].value, 0.5);
  EXPECT_EQ(trials[0].intermediate().size(), 1u);
  EXPECT_TRUE(store.claim_trial("w", 60, std::nullopt, [](int, auto&) { return nlohmann::json{{"lr", 0.02}}; }));
}

TEST(SweepStore, RefusesFilesThatAreNotStudies) {
  auto text = temporary_path("notes.sqlite");
  std::ofstream(text) << "these are not the trials you are looking for\n";
  EXPECT_THROW(StudyStore(text, StudyStore::Mode::read_write), BadInput);
  EXPECT_THROW(StudyStore(text, StudyStore::Mode::read_only), BadInput);
  auto missing = temporary_path("missing.sqlite");
  EXPECT_THROW(StudyStore(missing, StudyStore::Mode::read_only), BadInput);
  EXPECT_FALSE(std::filesystem::exists(missing));
  // An SQLite database of something else.
  auto foreign = temporary_path("foreign.sqlite");
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(foreign.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE photos(id INTEGER)", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  try {
    StudyStore store(foreign, StudyStore::Mode::read_write);
    ADD_FAILURE() << "a foreign database was accepted";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("not a tessera study"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera::sweep
