// The sweep against trial children that break the protocol or the rules (a shell script stands
// in for `tessera train`, as a user's wrapper or a broken build would): a grandchild that holds
// the report pipe, a flood of report lines, a line of hundreds of megabytes, and a study whose
// stored search space or trials were edited to reach every worker that continues it.
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "common/error.h"
#include "sweep/store.h"
#include "sweep/sweep.h"

namespace tessera::sweep {
namespace {

namespace fs = std::filesystem;

fs::path work_dir() {
  struct Scratch {
    fs::path path = fs::temp_directory_path() / ("tessera_sweep_protocol_" + std::to_string(getpid()));
    ~Scratch() { fs::remove_all(path); }
  };
  static Scratch scratch;
  auto dir = scratch.path / ::testing::UnitTest::GetInstance()->current_test_info()->name();
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

const char* final_line = R"({"type":"final","value":0.5,"metrics":{"val_loss":0.5}})";

// A sweep whose trials run `script` (sh) in place of `tessera train`: it sees train's flags as
// its arguments and writes its report to fd 3.
SweepOptions sweep_running(const fs::path& dir, const std::string& script, int trials = 1) {
  fs::path path = dir / "trial.sh";
  std::ofstream(path) << script;
  SweepOptions options;
  options.study = (dir / "study.sqlite").string();
  options.config.sampler = "random";
  options.config.target_trials = trials;
  options.config.space = parse_space({"lr=loguniform:1e-3:1e-1"});
  options.config.train_flags = {"--data", "patches.h5"};
  options.train.names = {"--data", "--lr", "--report-fd", "--device", "--batch", "--accumulate", "--checkpoint"};
  options.tessera = {"/bin/sh", path.string()};
  return options;
}

std::vector<Trial> trials_of(const SweepOptions& options) {
  return StudyStore(options.study, StudyStore::Mode::read_only).trials();
}

// Whether the process whose pid the file holds still runs, once a SIGKILL sent to it has had up
// to ten seconds to land (a killed process whose parent died may stay a zombie: that is dead).
bool alive(const fs::path& pid_file) {
  pid_t pid = 0;
  std::ifstream(pid_file) >> pid;
  if (pid <= 0) return false;
  auto running = [&] {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), {});
    auto state = text.rfind(") ");
    return !text.empty() && state != std::string::npos && text[state + 2] != 'Z' && text[state + 2] != 'X';
  };
  for (int wait = 0; wait < 1000 && running(); ++wait) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return running();
}

// The peak resident memory of this process so far, in KiB.
int64_t peak_resident_kib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6));
  return -1;
}

void execute(sqlite3* database, const std::string& sql) {
  char* error = nullptr;
  ASSERT_EQ(sqlite3_exec(database, sql.c_str(), nullptr, nullptr, &error), SQLITE_OK) << (error ? error : "");
}

void edit_study(const SweepOptions& options, const std::string& sql) {
  sqlite3* database = nullptr;
  ASSERT_EQ(sqlite3_open(options.study.c_str(), &database), SQLITE_OK);
  execute(database, sql);
  sqlite3_close(database);
}

TEST(SweepProtocol, AGrandchildHoldingTheReportPipeDoesNotHoldItsTrial) {
  auto dir = work_dir();
  // The trial reports and exits; a process it started keeps fd 3 (and stderr) open for 50 minutes
  // (the sweep used to wait for it, past any test timeout).
  auto options = sweep_running(dir, std::string("echo '") + final_line + "' >&3\n"
                                        "sleep 3000 &\n"
                                        "echo $! > " + (dir / "grandchild.pid").string() + "\n"
                                        "exit 0\n");
  run_sweep(options);
  auto trials = trials_of(options);
  ASSERT_EQ(trials.size(), 1u);
  EXPECT_EQ(trials[0].state, TrialState::complete) << trials[0].attempts[0].stderr_tail;
  EXPECT_EQ(trials[0].value, 0.5);
  EXPECT_FALSE(alive(dir / "grandchild.pid")) << "the rest of the trial's process group was left running";
}

TEST(SweepProtocol, TrialTimeoutStopsTheTrialAndEverythingItStarted) {
  auto dir = work_dir();
  auto options = sweep_running(dir, "sleep 3000 &\n"
                                    "echo $! > " + (dir / "grandchild.pid").string() + "\n"
                                    "sleep 3000\n");
  options.trial_timeout = 1;
  options.timeout_grace = 1;
  run_sweep(options);
  auto trials = trials_of(options);
  ASSERT_EQ(trials.size(), 1u);
  EXPECT_EQ(trials[0].state, TrialState::timeout);
  EXPECT_FALSE(alive(dir / "grandchild.pid"));
}

TEST(SweepProtocol, TwoHundredThousandIntermediateLinesAreAllRecorded) {
  auto dir = work_dir();
  // Before, each line rewrote every value so far in the study: over 300 s for these.
  auto options = sweep_running(dir, std::string("awk 'BEGIN { for (s = 1; s <= 200000; ++s) "
                                                "printf \"{\\\"type\\\":\\\"intermediate\\\",\\\"step\\\":%d,"
                                                "\\\"value\\\":%d}\\n\", s, s }' >&3\n"
                                                "echo '") + final_line + "' >&3\n");
  options.config.pruner = "median";
  run_sweep(options);
  auto trials = trials_of(options);
  ASSERT_EQ(trials.size(), 1u);
  EXPECT_EQ(trials[0].state, TrialState::complete) << trials[0].attempts[0].stderr_tail;
  const auto& values = trials[0].intermediate();
  ASSERT_EQ(values.size(), 200000u);
  for (size_t i : {size_t{0}, size_t{1234}, size_t{199999}}) {
    EXPECT_EQ(values[i].first, static_cast<int64_t>(i + 1));
    EXPECT_EQ(values[i].second, static_cast<double>(i + 1));
  }
}

TEST(SweepProtocol, AnOverlongReportLineIsAProtocolErrorNotAMemoryBlowUp) {
  auto dir = work_dir();
  // 300 MB on one line, then a well-formed final report.
  auto options = sweep_running(dir, std::string("head -c 300000000 /dev/zero | tr '\\0' x >&3\n"
                                                "echo >&3\n"
                                                "echo '") + final_line + "' >&3\n");
  int64_t before = peak_resident_kib();
  run_sweep(options);
  int64_t growth = peak_resident_kib() - before;
  auto trials = trials_of(options);
  ASSERT_EQ(trials.size(), 1u);
  const Attempt& attempt = trials[0].attempts[0];
  EXPECT_EQ(trials[0].state, TrialState::complete) << attempt.stderr_tail;
  EXPECT_NE(attempt.stderr_tail.find("report line 1 is longer than"), std::string::npos) << attempt.stderr_tail;
  // Before, the line was kept whole (and copied): 554 MB. Now a line is bounded at 1 MiB.
  EXPECT_LT(growth, 64 * 1024) << "KiB of peak resident memory";
}

// What someone who can write the study stores as its search space: lr, and `extra`.
void store_space(const SweepOptions& options, const Param& extra, double lr_low = 0.001) {
  SearchSpace space{{"lr", Distribution::log_uniform, lr_low, 0.1, {}}};
  if (!extra.name.empty()) space.push_back(extra);
  edit_study(options, "UPDATE studies SET space = '" + to_json(space).dump() + "'");
}

// A run that continues the study with its stored settings (sweep --resume alone), to 2 trials.
SweepOptions resuming(const SweepOptions& options) {
  SweepOptions resume = options;
  resume.settings_given = false;
  resume.resume = true;
  resume.config = {};
  resume.config.target_trials = 2;
  return resume;
}

TEST(SweepProtocol, AStoredEnvironmentParameterNeedsTheContinuingRunsAllowance) {
  auto dir = work_dir();
  auto options = sweep_running(dir, "echo \"$TESSERA_SWEEP_PROBE\" >> " + (dir / "seen").string() + "\n" +
                                        "echo '" + final_line + "' >&3\n");
  options.config.space = parse_space({"lr=loguniform:1e-3:1e-1", "env:TESSERA_SWEEP_PROBE=choice:a"});
  run_sweep(options);  // given on this command line: allowed
  // Someone who can write the study turns the parameter into one that loads code into every trial.
  store_space(options, {"env:LD_PRELOAD", Distribution::choice, 0, 0, {(dir / "evil.so").string()}});
  SweepOptions resume = resuming(options);
  try {
    run_sweep(resume);
    ADD_FAILURE() << "the stored env: parameter was taken without --allow-env";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--allow-env LD_PRELOAD"), std::string::npos) << e.what();
  }
  EXPECT_EQ(trials_of(options).size(), 1u) << "no trial ran";

  // A variable the continuing run allows is set as before.
  store_space(options, {"env:TESSERA_SWEEP_PROBE", Distribution::choice, 0, 0, {"b"}});
  resume.allowed_environment = {"TESSERA_SWEEP_PROBE"};
  run_sweep(resume);
  std::ifstream seen(dir / "seen");
  std::string first, second;
  seen >> first >> second;
  EXPECT_EQ(first, "a");
  EXPECT_EQ(second, "b");
}

TEST(SweepProtocol, AStoredSpaceOrTrialTheCommandLineWouldRefuseIsBadInput) {
  auto dir = work_dir();
  auto options = sweep_running(dir, std::string("echo '") + final_line + "' >&3\n");
  run_sweep(options);
  store_space(options, {}, 0);
  try {
    run_sweep(resuming(options));
    ADD_FAILURE() << "a log distribution from 0 was taken";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("LOW > 0"), std::string::npos) << e.what();
  }
  // A trial to run again whose value lies outside the space.
  store_space(options, {});
  edit_study(options, "UPDATE trials SET state = 'interrupted', params = '{\"lr\": \"; rm -rf /\"}'");
  try {
    run_sweep(resuming(options));
    ADD_FAILURE() << "a trial value outside the space was run";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("trial 0 holds lr="), std::string::npos) << e.what();
  }
}

// JSON nested 100000 deep, in a trial's report line and in the study: the sweep copied a line's
// metrics (a SIGSEGV of the sweep itself) and its study's rows; now the line is ignored as any
// line off the protocol, and the row is bad input naming it.
TEST(SweepProtocol, DeeplyNestedJsonIsIgnoredOrRefusedNotASignal) {
  auto dir = work_dir();
  std::ofstream(dir / "deep.json") << R"({"type":"final","value":0.25,"metrics":)" << std::string(100000, '[')
                                     << std::string(100000, ']') << "}\n";
  auto options =
      sweep_running(dir, "cat '" + (dir / "deep.json").string() + "' >&3\necho '" + final_line + "' >&3\n");
  run_sweep(options);
  auto trials = trials_of(options);
  ASSERT_EQ(trials.size(), 1u);
  EXPECT_EQ(trials[0].state, TrialState::complete) << trials[0].attempts[0].stderr_tail;
  EXPECT_EQ(trials[0].attempts[0].value, 0.5);  // the well-formed line's
  edit_study(options, "UPDATE trials SET params = '" + std::string(100000, '[') + std::string(100000, ']') + "'");
  try {
    run_sweep(resuming(options));
    ADD_FAILURE() << "a study with nested parameters was continued";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("the study's trial parameters (damaged): JSON refused: nested deeper than 64 "
                                         "levels"),
              std::string::npos)
        << e.what();
    EXPECT_LT(std::string(e.what()).size(), 300u);
  }
}

}  // namespace
}  // namespace tessera::sweep
