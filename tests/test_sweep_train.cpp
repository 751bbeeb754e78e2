// tessera sweep against the real `tessera train`: faults in trials, the in-process leak that
// isolation solves, --oom-retry, a killed and resumed sweep, bad input, and a learning-rate
// search on a small patch task.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "sweep/child.h"
#include "sweep/store.h"

namespace tessera::sweep {
namespace {

namespace fs = std::filesystem;

// This process's scratch directory, removed when the process ends.
const fs::path& scratch() {
  struct Scratch {
    fs::path path = fs::temp_directory_path() / ("tessera_sweep_" + std::to_string(getpid()));
    ~Scratch() { fs::remove_all(path); }
  };
  static Scratch scratch;
  return scratch.path;
}

fs::path work_dir() {
  auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  auto dir = scratch() / info->name();
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// A PCam-layout patch task from tools/make_patch_task.py, made once per size.
std::string patch_task(int count, int size) {
  auto path = scratch() / ("task_" + std::to_string(count) + "x" + std::to_string(size) + ".h5");
  if (!fs::exists(path)) {
    fs::create_directories(path.parent_path());
    auto made = run_captured({"/usr/bin/python3", TESSERA_SOURCE_DIR "/tools/make_patch_task.py", "--out",
                              path.string(), "--count", std::to_string(count), "--size", std::to_string(size),
                              "--seed", "1"});
    EXPECT_EQ(made.wait_status, 0) << made.errors;
  }
  return path.string();
}

struct Result {
  int exit_code;
  std::string output, errors;
};

Result tessera(std::vector<std::string> args, const Environment& environment = {}) {
  args.insert(args.begin(), TESSERA_BINARY);
  auto run = run_captured(args, environment);
  return {WIFEXITED(run.wait_status) ? WEXITSTATUS(run.wait_status) : 128 + WTERMSIG(run.wait_status), run.output,
          run.errors};
}

std::vector<Trial> trials_of(const fs::path& study) {
  return StudyStore(study, StudyStore::Mode::read_only).trials();
}

int64_t resident_kib(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  return -1;
}

// Runs a sweep as a child, sampling its resident memory every 20 ms until it exits.
struct Sampled {
  int exit_code;
  std::string errors;
  std::vector<int64_t> resident_kib;
};

Sampled sweep_sampling_memory(std::vector<std::string> args, const Environment& environment) {
  args.insert(args.begin(), {TESSERA_BINARY, "sweep"});
  ChildProcess sweep(args, environment);
  Sampled sampled;
  while (sweep.report_fd() >= 0 || sweep.stderr_fd() >= 0) {
    pollfd fds[2] = {{sweep.report_fd(), POLLIN, 0}, {sweep.stderr_fd(), POLLIN, 0}};
    poll(fds, 2, 20);
    sweep.read_report();
    sweep.read_stderr();
    if (int64_t kib = resident_kib(sweep.pid()); kib > 0) sampled.resident_kib.push_back(kib);
  }
  sweep.wait();
  sampled.exit_code = WIFEXITED(sweep.wait_status()) ? WEXITSTATUS(sweep.wait_status()) : -1;
  sampled.errors = sweep.stderr_tail();
  return sampled;
}

TEST(SweepCommand, BadInputIsAClearErrorBeforeAnyTrial) {
  auto dir = work_dir();
  auto data = patch_task(64, 16);
  auto study = (dir / "study.sqlite").string();
  struct Case {
    std::vector<std::string> args;
    int exit_code;
    std::string message;
  };
  std::ofstream(dir / "notes.sqlite") << "not a database\n";
  std::vector<Case> cases = {
      {{"--param", "lr=loguniform:1e-3:1e-1", "--", "--data", data, "--bogus", "1"}, 2, "--bogus"},
      {{"--param", "widht=int:4:8", "--", "--data", data}, 2, "--widht"},
      {{"--param", "lr=loguniform:0:1", "--", "--data", data}, 2, "LOW > 0"},
      {{"--param", "lr=normal:0:1", "--", "--data", data}, 2, "unknown distribution"},
      {{"--sampler", "grid", "--param", "batch=choice:", "--", "--data", data}, 2, "empty choice"},
      {{"--sampler", "grid", "--param", "lr=uniform:0.1:1", "--", "--data", data}, 2, "continuous"},
      {{"--devices", "0,7", "--param", "lr=loguniform:1e-3:1e-1", "--", "--data", data}, 2, "no device 7"},
      {{"--param", "lr=loguniform:1e-3:1e-1", "--", "--data", data, "--report-fd", "5"}, 2, "--report-fd"},
      {{"--param", "lr=loguniform:1e-3:1e-1", "--", "--data", data, "--lr", "0.1"}, 2, "--lr"},
      {{"--param", "lr=loguniform:1e-3:1e-1", "--", "--data", data, "--checkpoint", "c.h5"}, 2, "{trial}"},
      {{"--objective", "wobble", "--param", "lr=loguniform:1e-3:1e-1", "--", "--data", data}, 2, "--direction"},
  };
  for (auto& c : cases) {
    std::vector<std::string> args = {"sweep", "--study", study, "--trials", "2"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    auto result = tessera(args);
    EXPECT_EQ(result.exit_code, c.exit_code) << c.message << ": " << result.errors;
    EXPECT_NE(result.errors.find(c.message), std::string::npos) << result.errors;
    EXPECT_FALSE(fs::exists(study)) << "a failed check left a study behind (" << c.message << ")";
  }
  auto not_a_study = tessera({"sweep", "--study", (dir / "notes.sqlite").string(), "--trials", "2", "--param",
                              "lr=loguniform:1e-3:1e-1", "--", "--data", data});
  EXPECT_EQ(not_a_study.exit_code, 5);
  EXPECT_NE(not_a_study.errors.find("not a tessera study"), std::string::npos) << not_a_study.errors;
  auto show = tessera({"sweep", "--study", (dir / "notes.sqlite").string(), "--show"});
  EXPECT_EQ(show.exit_code, 5);
  auto missing = tessera({"sweep", "--study", (dir / "missing.sqlite").string(), "--export", "csv"});
  EXPECT_EQ(missing.exit_code, 5);
  EXPECT_NE(missing.errors.find("missing.sqlite"), std::string::npos) << missing.errors;

  // Data that every trial would fail on stops the sweep after the first, with train's code.
  auto no_data = tessera({"sweep", "--study", study, "--trials", "4", "--param", "lr=loguniform:1e-3:1e-1", "--",
                          "--data", (dir / "absent.h5").string()});
  EXPECT_EQ(no_data.exit_code, 5) << no_data.errors;
  EXPECT_NE(no_data.errors.find("absent.h5"), std::string::npos) << no_data.errors;
  auto trials = trials_of(study);
  ASSERT_EQ(trials.size(), 1u);
  EXPECT_EQ(trials[0].state, TrialState::failed);
  EXPECT_EQ(trials[0].attempts[0].exit_code, 5);
  // Another command on the study is refused, naming what differs.
  auto again = tessera({"sweep", "--study", study, "--trials", "2", "--param", "lr=loguniform:1e-3:1e-1", "--",
                        "--data", data});
  EXPECT_EQ(again.exit_code, 2);
  EXPECT_NE(again.errors.find("train flags after --: '--data " + (dir / "absent.h5").string()), std::string::npos)
      << again.errors;
  EXPECT_EQ(trials_of(study).size(), 1u);
}

TEST(SweepTrain, FaultyTrialsAreRecordedWhileTheOthersFinish) {
  auto dir = work_dir();
  auto study = (dir / "faults.sqlite").string();
  // An empty value leaves TESSERA_FAULT unset: a healthy trial. No trial timeout here, so that a
  // healthy trial on a loaded machine is never cut short; the hanging trial has a sweep of its own.
  auto result = tessera({"sweep", "--study", study, "--trials", "6", "--sampler", "grid", "--parallel", "2", "--param",
                         "env:TESSERA_FAULT=choice:,leak:1MiB,segfault,oom,nan", "--", "--data", patch_task(64, 16),
                         "--epochs", "1", "--batch", "16"});
  ASSERT_EQ(result.exit_code, 0) << result.errors;
  auto trials = trials_of(study);
  ASSERT_EQ(trials.size(), 5u);  // the grid's size, though 6 were asked for
  std::map<std::string, const Trial*> by_fault;
  for (auto& trial : trials) by_fault[trial.params["env:TESSERA_FAULT"].get<std::string>()] = &trial;
  for (auto* healthy : {by_fault[""], by_fault["leak:1MiB"]}) {
    EXPECT_EQ(healthy->state, TrialState::complete);
    ASSERT_TRUE(healthy->value.has_value());
    EXPECT_EQ(healthy->intermediate().size(), 1u);
    EXPECT_GT(healthy->attempts[0].peak_device_bytes.value_or(0), 0u);
    EXPECT_FALSE(healthy->attempts[0].device.empty());
  }
  // Same flags and seed: a leak beside the run must not change its result.
  EXPECT_EQ(*by_fault[""]->value, *by_fault["leak:1MiB"]->value);
  // The leaked MiB shows in the leaking trial's peak.
  EXPECT_GE(*by_fault["leak:1MiB"]->attempts[0].peak_device_bytes, *by_fault[""]->attempts[0].peak_device_bytes + (1u << 20));
  EXPECT_EQ(by_fault["segfault"]->state, TrialState::crashed);
  EXPECT_EQ(by_fault["segfault"]->attempts[0].signal, SIGSEGV);
  EXPECT_EQ(by_fault["oom"]->state, TrialState::oom);
  EXPECT_EQ(by_fault["oom"]->attempts[0].exit_code, 3);
  EXPECT_NE(by_fault["oom"]->attempts[0].stderr_tail.find("TESSERA_FAULT=oom"), std::string::npos)
      << by_fault["oom"]->attempts[0].stderr_tail;
  EXPECT_EQ(by_fault["nan"]->state, TrialState::diverged);
  EXPECT_EQ(by_fault["nan"]->attempts[0].exit_code, 4);

  // A trial that hangs for ever is stopped at its timeout, however loaded the machine.
  const double trial_timeout = 2;
  auto hang_study = (dir / "hang.sqlite").string();
  auto hung = tessera({"sweep", "--study", hang_study, "--trials", "1", "--trial-timeout",
                       std::to_string(static_cast<int>(trial_timeout)), "--timeout-grace", "1", "--param",
                       "env:TESSERA_FAULT=choice:hang", "--", "--data", patch_task(64, 16), "--epochs", "1"});
  ASSERT_EQ(hung.exit_code, 0) << hung.errors;
  auto hang = trials_of(hang_study);
  ASSERT_EQ(hang.size(), 1u);
  EXPECT_EQ(hang[0].state, TrialState::timeout);
  EXPECT_GE(hang[0].attempts[0].finished - hang[0].attempts[0].started, trial_timeout);
  EXPECT_NE(tessera({"sweep", "--study", hang_study, "--show"}).output.find("timeout"), std::string::npos);

  auto shown = tessera({"sweep", "--study", study, "--show"});
  EXPECT_EQ(shown.exit_code, 0);
  for (const char* state : {"complete", "crashed", "oom", "diverged"})
    EXPECT_NE(shown.output.find(state), std::string::npos) << shown.output;
  auto svg_path = dir / "history.svg";
  EXPECT_EQ(tessera({"sweep", "--study", study, "--export", "svg", "--output", svg_path.string()}).exit_code, 0);
  std::ifstream svg(svg_path);
  std::string text((std::istreambuf_iterator<char>(svg)), {});
  EXPECT_NE(text.find("optimisation history"), std::string::npos);
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n') > 10, true);
}

TEST(SweepTrain, LeakingTrialsExhaustOneProcessButNotIsolatedTrials) {
  auto dir = work_dir();
  // Each trial leaks 5 MiB of a 16 MiB budget and needs about 5 MiB itself.
  Environment leaking = {{"TESSERA_FAULT", "leak:5MiB"}};
  std::vector<std::string> common = {"--trials", "5", "--sampler", "random", "--param", "lr=loguniform:1e-3:1e-1",
                                     "--", "--data", patch_task(64, 16), "--epochs", "1", "--batch", "16",
                                     "--device-memory-limit", "16MiB"};
  std::vector<std::string> in_process = {"--study", (dir / "none.sqlite").string(), "--isolation", "none"};
  in_process.insert(in_process.end(), common.begin(), common.end());
  auto shared = sweep_sampling_memory(in_process, leaking);
  ASSERT_EQ(shared.exit_code, 0) << shared.errors;
  auto shared_trials = trials_of(dir / "none.sqlite");
  ASSERT_EQ(shared_trials.size(), 5u);
  EXPECT_EQ(shared_trials[0].state, TrialState::complete);
  EXPECT_EQ(shared_trials[1].state, TrialState::complete);
  for (size_t t = 2; t < 5; ++t) {
    EXPECT_EQ(shared_trials[t].state, TrialState::oom) << "trial " << t;
    EXPECT_NE(shared_trials[t].attempts[0].stderr_tail.find("in use"), std::string::npos)
        << shared_trials[t].attempts[0].stderr_tail;
  }

  std::vector<std::string> isolated = {"--study", (dir / "process.sqlite").string(), "--parallel", "2"};
  isolated.insert(isolated.end(), common.begin(), common.end());
  auto separate = sweep_sampling_memory(isolated, leaking);
  ASSERT_EQ(separate.exit_code, 0) << separate.errors;
  auto trials = trials_of(dir / "process.sqlite");
  ASSERT_EQ(trials.size(), 5u);
  uint64_t lowest = UINT64_MAX, highest = 0;
  for (auto& trial : trials) {
    EXPECT_EQ(trial.state, TrialState::complete) << "trial " << trial.number;
    lowest = std::min(lowest, trial.attempts[0].sweep_rss_bytes);
    highest = std::max(highest, trial.attempts[0].sweep_rss_bytes);
  }
  // The sweep's own memory, as it measured itself after each trial and as sampled from
  // outside, stays flat and small: nothing of a trial lives in it. "Flat" is measured against
  // what a trial leaks, not in a fixed number of KiB that a loaded machine can cross (allocator
  // arenas and the study's page cache move by a few MiB with timing): had the sweep kept a
  // trial's leak, it would grow by 5 MiB a trial, 20 MiB over these 5.
  constexpr uint64_t leak_bytes = uint64_t{5} << 20;
  std::printf("isolated sweep resident memory: %.1f to %.1f MiB after trials, sampled peak %.1f MiB; "
              "in-process sweep sampled peak %.1f MiB\n",
              lowest / 1048576.0, highest / 1048576.0,
              *std::max_element(separate.resident_kib.begin(), separate.resident_kib.end()) / 1024.0,
              *std::max_element(shared.resident_kib.begin(), shared.resident_kib.end()) / 1024.0);
  EXPECT_LT(highest - lowest, leak_bytes / 2) << "bytes of growth over 5 trials, against a 5 MiB leak per trial";
  ASSERT_GT(separate.resident_kib.size(), 10u);
  auto settled = separate.resident_kib.begin() + static_cast<std::ptrdiff_t>(separate.resident_kib.size() / 4);
  auto [low, high] = std::minmax_element(settled, separate.resident_kib.end());
  EXPECT_LT(static_cast<uint64_t>(*high - *low) * 1024, leak_bytes)
      << "KiB of growth sampled over the last trials: less than one trial's leak";
  EXPECT_LT(*high, 64 * 1024) << "KiB";
}

TEST(SweepTrain, OomRetryHalvesTheMicroBatchAndKeepsTheEffectiveBatch) {
  auto dir = work_dir();
  auto study = (dir / "retry.sqlite").string();
  // Micro-batches of 64 and 32 need about 11 and 6.1 MiB; 16 needs 3.7 MiB.
  std::vector<std::string> flags = {"--", "--data", patch_task(256, 16), "--epochs", "1", "--batch", "64",
                                    "--device-memory-limit", "5MiB"};
  std::vector<std::string> args = {"sweep", "--study", study, "--trials", "1", "--sampler", "grid", "--param",
                                   "lr=choice:0.05", "--oom-retry"};
  args.insert(args.end(), flags.begin(), flags.end());
  auto result = tessera(args);
  ASSERT_EQ(result.exit_code, 0) << result.errors;
  auto trials = trials_of(study);
  ASSERT_EQ(trials.size(), 1u);
  EXPECT_EQ(trials[0].state, TrialState::complete);
  ASSERT_EQ(trials[0].attempts.size(), 3u);
  std::vector<std::pair<int64_t, int64_t>> batches;
  for (auto& attempt : trials[0].attempts) batches.push_back({attempt.batch, attempt.accumulate});
  EXPECT_EQ(batches, (std::vector<std::pair<int64_t, int64_t>>{{64, 0}, {32, 2}, {16, 4}}));
  EXPECT_EQ(trials[0].attempts[0].state, TrialState::oom);
  EXPECT_EQ(trials[0].attempts[1].state, TrialState::oom);
  EXPECT_EQ(trials[0].attempts[2].state, TrialState::complete);
  // The retries were needed and the last one fits: train's plan for a micro-batch of 32 is over
  // the limit, and the completed attempt's measured peak is the plan for 16.
  auto plan = [&](const char* batch) {
    auto dry = tessera({"train", "--data", patch_task(256, 16), "--batch", batch, "--dry-run"});
    EXPECT_EQ(dry.exit_code, 0) << dry.errors;
    return nlohmann::json::parse(dry.output.substr(0, dry.output.find('\n')))["total_bytes"].get<double>();
  };
  EXPECT_GT(plan("32"), 5u << 20);
  double measured = static_cast<double>(*trials[0].attempts[2].peak_device_bytes), planned = plan("16");
  EXPECT_NEAR(measured, planned, 0.1 * planned);
  auto& command = trials[0].attempts[2].command;
  auto at = std::find(command.begin(), command.end(), "--accumulate");
  ASSERT_NE(at, command.end());
  EXPECT_EQ(*(at + 1), "4");

  // With a floor of 32 the trial ends out of memory after two attempts.
  auto floored = (dir / "floor.sqlite").string();
  args[2] = floored;
  args.insert(args.begin() + 10, {"--min-batch", "32"});
  ASSERT_EQ(tessera(args).exit_code, 0);
  auto floor_trials = trials_of(floored);
  EXPECT_EQ(floor_trials[0].state, TrialState::oom);
  EXPECT_EQ(floor_trials[0].attempts.size(), 2u);
}

TEST(SweepTrain, OomRetryHalvesTheBatchTrainChoseFromItsPlan) {
  // Without --batch train chooses the batch from its plan and tells the sweep, whose --oom-retry
  // halves that one. Every attempt runs out of memory (TESSERA_FAULT=oom, after the choice), so
  // the trial takes each batch from the chosen one down to 1, its accumulation doubling.
  auto dir = work_dir();
  auto study = (dir / "chosen.sqlite").string();
  std::string data = patch_task(256, 16);
  auto dry = tessera({"train", "--data", data, "--epochs", "1", "--dry-run"});
  ASSERT_EQ(dry.exit_code, 0) << dry.errors;
  int64_t chosen = 0;  // from train's batch event (JSON lines on stderr off a terminal)
  std::istringstream lines(dry.errors);
  for (std::string line; std::getline(lines, line);)
    if (auto event = nlohmann::json::parse(line, nullptr, false); event.is_object() && event.value("event", "") == "batch")
      chosen = event["batch"].get<int64_t>();
  ASSERT_GE(chosen, 2) << dry.errors;
  auto result = tessera({"sweep", "--study", study, "--trials", "1", "--sampler", "grid", "--param", "lr=choice:0.05",
                         "--oom-retry", "--", "--data", data, "--epochs", "1"},
                        {{"TESSERA_FAULT", "oom"}});
  ASSERT_EQ(result.exit_code, 0) << result.errors;
  auto trials = trials_of(study);
  ASSERT_EQ(trials.size(), 1u);
  EXPECT_EQ(trials[0].state, TrialState::oom);
  std::vector<std::pair<int64_t, int64_t>> batches, expected;
  for (auto& attempt : trials[0].attempts) {
    batches.push_back({attempt.batch, attempt.accumulate});
    EXPECT_EQ(attempt.state, TrialState::oom);
  }
  for (int64_t batch = chosen, accumulate = 1; batch >= 1; batch /= 2, accumulate *= 2) expected.push_back({batch, accumulate});
  EXPECT_EQ(batches, expected);
}

// Trials wait on files (TESSERA_FAULT=wait:DIR): DIR/started-N says trial N runs, DIR/go-N lets it go on.
struct Gate {
  fs::path dir;
  explicit Gate(const fs::path& at) : dir(at) { fs::create_directories(dir); }
  Environment environment() const { return {{"TESSERA_FAULT", "wait:" + dir.string()}}; }
  void release(int trial) const { std::ofstream(dir / ("go-" + std::to_string(trial))) << "go\n"; }
  bool started(int trial) const { return fs::exists(dir / ("started-" + std::to_string(trial))); }
};

// Waits for an event while reading the sweep's stderr, so that it never blocks on a full pipe.
void wait_for(ChildProcess& sweep, const std::function<bool()>& event) {
  while (!event()) {
    sweep.read_stderr();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

bool trial_complete(const fs::path& study, size_t number) {
  try {
    auto trials = trials_of(study);
    return trials.size() > number && trials[number].state == TrialState::complete;
  } catch (const std::exception&) {
    return false;  // the study is still being created
  }
}

TEST(SweepTrain, KilledSweepResumesWithEveryTrialRecordedOnce) {
  auto dir = work_dir();
  auto study = dir / "resume.sqlite";
  Gate gate(dir / "gate");
  std::vector<std::string> args = {"sweep", "--study", study.string(), "--trials", "4", "--parallel", "2",
                                   "--sampler", "grid", "--param", "lr=choice:0.01,0.03", "--param",
                                   "epochs=choice:1,2", "--", "--data", patch_task(64, 16), "--batch", "16"};
  std::vector<std::string> command = args;
  command.insert(command.begin(), TESSERA_BINARY);
  {
    // Trial 0 goes on and trial 1 waits: the sweep is killed while trial 1 runs.
    gate.release(0);
    ChildProcess sweep(command, gate.environment());
    wait_for(sweep, [&] { return trial_complete(study, 0) && gate.started(1); });
    sweep.send(SIGKILL);
    sweep.wait();
    ASSERT_TRUE(WIFSIGNALED(sweep.wait_status()));
  }
  // With no sweep writing the file, --show calls the dead sweep's trial interrupted, not running.
  auto before = trials_of(study);
  ASSERT_GE(before.size(), 2u);
  EXPECT_EQ(before[1].state, TrialState::interrupted);
  EXPECT_EQ(tessera({"sweep", "--study", study.string(), "--show"}).output.find("running"), std::string::npos);
  double first_finished = before[0].attempts[0].finished;
  for (int trial = 1; trial < 4; ++trial) gate.release(trial);

  // The same command again continues the study.
  auto resumed = tessera(args, gate.environment());
  ASSERT_EQ(resumed.exit_code, 0) << resumed.errors;
  auto after = trials_of(study);
  ASSERT_EQ(after.size(), 4u);
  std::set<std::string> params;
  for (size_t n = 0; n < after.size(); ++n) {
    EXPECT_EQ(after[n].number, static_cast<int>(n));
    EXPECT_EQ(after[n].state, TrialState::complete) << "trial " << n;
    params.insert(after[n].params.dump());
    // A trial that was running is interrupted once and then complete; no other attempts.
    for (size_t a = 0; a + 1 < after[n].attempts.size(); ++a)
      EXPECT_EQ(after[n].attempts[a].state, TrialState::interrupted) << "trial " << n;
  }
  EXPECT_EQ(params.size(), 4u) << "every grid point once";
  ASSERT_EQ(after[0].attempts.size(), 1u) << "a finished trial is not run again";
  EXPECT_EQ(after[0].attempts[0].finished, first_finished);
  EXPECT_EQ(after[1].attempts.size(), 2u);

  // With --resume added the same command is accepted and has nothing left to do.
  auto with_resume = args;
  with_resume.insert(with_resume.begin() + 3, "--resume");
  auto again = tessera(with_resume);
  EXPECT_EQ(again.exit_code, 0) << again.errors;
  EXPECT_EQ(trials_of(study).size(), 4u);
  // A changed --param is refused, naming it.
  auto changed = args;
  *std::find(changed.begin(), changed.end(), "lr=choice:0.01,0.03") = "lr=choice:0.01,0.05";
  auto refused = tessera(changed);
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_NE(refused.errors.find("--param lr: choice:0.01,0.03 in the study, choice:0.01,0.05 here"), std::string::npos)
      << refused.errors;
}

TEST(SweepTrain, ASignalledSweepRecordsItsTrialAsInterruptedAndLocksItsStudy) {
  auto dir = work_dir();
  auto study = dir / "signal.sqlite";
  Gate gate(dir / "gate");
  std::vector<std::string> args = {"sweep", "--study", study.string(), "--trials", "2", "--param",
                                   "lr=loguniform:1e-3:1e-1", "--", "--data", patch_task(64, 16), "--batch", "16"};
  auto command = args;
  command.insert(command.begin(), TESSERA_BINARY);
  ChildProcess sweep(command, gate.environment());
  wait_for(sweep, [&] { return gate.started(0); });
  // A second sweep on the same file is refused while the first runs; the running trial is untouched.
  auto second = tessera({"sweep", "--study", study.string(), "--resume"});
  EXPECT_EQ(second.exit_code, 2);
  EXPECT_NE(second.errors.find("another sweep is running"), std::string::npos) << second.errors;
  auto during = trials_of(study);
  ASSERT_EQ(during.size(), 1u);
  EXPECT_EQ(during[0].state, TrialState::running);
  ASSERT_EQ(during[0].attempts.size(), 1u);

  sweep.send(SIGTERM);
  while (sweep.stderr_fd() >= 0 || sweep.report_fd() >= 0) {
    sweep.read_stderr();
    sweep.read_report();
  }
  sweep.wait();
  ASSERT_TRUE(WIFSIGNALED(sweep.wait_status()));
  EXPECT_EQ(WTERMSIG(sweep.wait_status()), SIGTERM);
  auto after = trials_of(study);
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].state, TrialState::interrupted);
  EXPECT_EQ(after[0].attempts[0].state, TrialState::interrupted);
  auto shown = tessera({"sweep", "--study", study.string(), "--show"});
  EXPECT_EQ(shown.output.find("running"), std::string::npos) << shown.output;
}

TEST(SweepTrain, AshaStopsTheTrialThatIsBehindAtTheFirstRung) {
  auto dir = work_dir();
  // The same two trials (training is deterministic) minimizing and maximizing: at the first rung
  // (epoch 1) the second trial is behind in exactly one direction, and only there it is stopped.
  std::map<std::string, std::vector<Trial>> by_direction;
  for (std::string direction : {"minimize", "maximize"}) {
    auto study = (dir / (direction + ".sqlite")).string();
    auto result = tessera({"sweep", "--study", study, "--trials", "2", "--sampler", "grid", "--pruner", "asha",
                           "--direction", direction, "--param", "lr=choice:0.1,0.00001", "--", "--data",
                           patch_task(64, 16), "--epochs", "3", "--batch", "16"});
    ASSERT_EQ(result.exit_code, 0) << result.errors;
    by_direction[direction] = trials_of(study);
    ASSERT_EQ(by_direction[direction].size(), 2u);
    EXPECT_EQ(by_direction[direction][0].state, TrialState::complete) << direction;
    EXPECT_EQ(by_direction[direction][0].intermediate().size(), 3u);
  }
  auto& first = by_direction["minimize"][0].intermediate();
  auto& second = by_direction["minimize"][1].intermediate();
  ASSERT_FALSE(second.empty());
  ASSERT_NE(first[0].second, second[0].second);
  auto behind = first[0].second < second[0].second ? "minimize" : "maximize";
  auto ahead = first[0].second < second[0].second ? "maximize" : "minimize";
  auto& stopped = by_direction[behind][1];
  EXPECT_EQ(stopped.state, TrialState::pruned);
  EXPECT_LT(stopped.intermediate().size(), 3u);
  EXPECT_FALSE(stopped.value.has_value());
  EXPECT_EQ(by_direction[ahead][1].state, TrialState::complete);
  EXPECT_EQ(by_direction[ahead][1].intermediate().size(), 3u);
}

TEST(SweepTrain, FindsAGoodLearningRateOnAPatchTask) {
  auto dir = work_dir();
  auto study = (dir / "lr.sqlite").string();
  auto result = tessera({"sweep", "--study", study, "--trials", "4", "--parallel", "2", "--sampler", "grid",
                         "--param", "lr=choice:0.001,0.01,0.1,1", "--", "--data", patch_task(512, 16), "--epochs",
                         "3", "--batch", "32", "--width", "8", "--momentum", "0.9"});
  ASSERT_EQ(result.exit_code, 0) << result.errors;
  auto trials = trials_of(study);
  ASSERT_EQ(trials.size(), 4u);
  std::map<double, double> loss_by_lr;
  for (auto& trial : trials) {
    ASSERT_EQ(trial.state, TrialState::complete);
    loss_by_lr[trial.params["lr"].get<double>()] = *trial.value;
  }
  auto json = nlohmann::json::parse(tessera({"sweep", "--study", study, "--export", "json"}).output);
  double best_lr = json["best"]["params"]["lr"].get<double>(), best = json["best"]["value"].get<double>();
  std::printf("validation loss by learning rate: 0.001 %.3f, 0.01 %.3f, 0.1 %.3f, 1 %.3f\n", loss_by_lr[0.001],
              loss_by_lr[0.01], loss_by_lr[0.1], loss_by_lr[1]);
  EXPECT_EQ(best_lr, 0.1);
  // Chance level is ln 2 = 0.693: the best rate learns, the others barely move.
  EXPECT_LT(best, 0.62);
  for (auto& [lr, loss] : loss_by_lr) {
    if (lr != best_lr) {
      EXPECT_GT(loss, best + 0.05) << "lr " << lr;
    }
  }
}

TEST(SweepTrain, ObjectiveValAccuracyPicksTheMostAccurateTrialWithOneCheckpointEach) {
  auto dir = work_dir();
  auto study = (dir / "accuracy.sqlite").string();
  auto checkpoints = dir / "runs";
  auto result = tessera({"sweep", "--study", study, "--trials", "3", "--parallel", "2", "--sampler", "grid",
                         "--objective", "val_accuracy", "--param", "lr=choice:0.00001,0.1,1", "--", "--data",
                         patch_task(512, 16), "--epochs", "3", "--batch", "32", "--width", "8", "--momentum", "0.9",
                         "--checkpoint", (checkpoints / "{trial}.h5").string()});
  ASSERT_EQ(result.exit_code, 0) << result.errors;
  auto trials = trials_of(study);
  ASSERT_EQ(trials.size(), 3u);
  double most = -1, least = 2;
  for (auto& trial : trials) {
    ASSERT_EQ(trial.state, TrialState::complete);
    double accuracy = trial.attempts.back().metrics["val_accuracy"].get<double>();
    EXPECT_EQ(*trial.value, accuracy) << "the trial's value is its val_accuracy";
    EXPECT_LT(*trial.value, 1.0) << "not val_loss";
    most = std::max(most, accuracy);
    least = std::min(least, accuracy);
    // One checkpoint per trial, each a readable HDF5 file with the trial's weights.
    auto path = checkpoints / (std::to_string(trial.number) + ".h5");
    auto read = run_captured({"/usr/bin/python3", "-c",
                              "import h5py, sys; f = h5py.File(sys.argv[1], 'r'); print(len(f['params']))",
                              path.string()});
    EXPECT_EQ(read.wait_status, 0) << path << ": " << read.errors;
    EXPECT_GT(std::atoi(read.output.c_str()), 0) << path;
  }
  ASSERT_GT(most, least) << "the trials must differ for the choice to mean something";
  auto json = nlohmann::json::parse(tessera({"sweep", "--study", study, "--export", "json"}).output);
  EXPECT_EQ(json["direction"], "maximize");
  EXPECT_EQ(json["objective"], "val_accuracy");
  EXPECT_EQ(json["best"]["value"].get<double>(), most);
  int best = json["best"]["number"].get<int>();
  auto best_checkpoint = (checkpoints / (std::to_string(best) + ".h5")).string();
  EXPECT_EQ(json["best"]["checkpoint"], best_checkpoint);
  auto shown = tessera({"sweep", "--study", study, "--show"});
  EXPECT_NE(shown.output.find("best checkpoint: " + best_checkpoint), std::string::npos) << shown.output;
}

}  // namespace
}  // namespace tessera::sweep
