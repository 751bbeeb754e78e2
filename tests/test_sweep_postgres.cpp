// Sweep workers sharing one study in a real, throwaway PostgreSQL server (initdb and pg_ctl in a
// temporary directory, as an unprivileged user, on a Unix socket): every trial claimed once,
// samplers that see the other worker's results, and a SIGKILLed worker's trial rerun by the
// other after the heartbeat grace. Trials wait on files (TESSERA_FAULT=wait:DIR), never on time.
#include <gtest/gtest.h>
#include <glob.h>
#include <pwd.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <thread>

#include "sweep/child.h"
#include "sweep/store.h"

namespace tessera::sweep {
namespace {

namespace fs = std::filesystem;

// Debian keeps the server's programs out of PATH.
std::optional<fs::path> postgres_bin() {
  glob_t found{};
  std::optional<fs::path> bin;
  if (glob("/usr/lib/postgresql/*/bin/initdb", 0, nullptr, &found) == 0 && found.gl_pathc > 0)
    bin = fs::path(found.gl_pathv[found.gl_pathc - 1]).parent_path();
  globfree(&found);
  return bin;
}

class PostgresServer {
 public:
  PostgresServer(const fs::path& bin, const fs::path& dir) : bin_(bin), dir_(dir) {
    fs::create_directories(dir);
    // initdb refuses root: the server runs as nobody, in a directory nobody owns.
    if (geteuid() == 0) {
      auto* nobody = getpwnam("nobody");
      if (!nobody) throw std::runtime_error("no user nobody to run PostgreSQL as");
      if (chown(dir.c_str(), nobody->pw_uid, nobody->pw_gid) != 0) throw std::runtime_error("chown failed");
      as_user_ = {"/usr/sbin/runuser", "-u", "nobody", "--"};
    }
    run({(bin_ / "initdb").string(), "-D", (dir / "data").string(), "-U", "tessera", "--auth=trust", "--no-sync",
         "-E", "UTF8"});
    run({(bin_ / "pg_ctl").string(), "-D", (dir / "data").string(), "-l", (dir / "log").string(), "-w", "-o",
         "-k " + dir.string() + " -c listen_addresses= -p 5432 -F", "start"});
    url_ = "postgresql:///postgres?host=" + dir.string() + "&user=tessera";
  }
  ~PostgresServer() {
    std::vector<std::string> stop = as_user_;
    stop.insert(stop.end(), {(bin_ / "pg_ctl").string(), "-D", (dir_ / "data").string(), "-m", "immediate", "stop"});
    run_captured(stop);
  }
  const std::string& url() const { return url_; }

 private:
  // The server must not inherit the report pipe (fd 3) of run_captured, which waits for its end.
  void run(std::vector<std::string> command) {
    command.insert(command.begin(), {"/bin/sh", "-c", "exec 3>&-; exec \"$@\"", "sh"});
    command.insert(command.begin() + 4, as_user_.begin(), as_user_.end());
    auto result = run_captured(command);
    if (result.wait_status != 0)
      throw std::runtime_error(command[4 + as_user_.size()] + " failed: " + result.errors + result.output);
  }
  fs::path bin_, dir_;
  std::vector<std::string> as_user_;
  std::string url_;
};

struct Fixture {
  fs::path dir;
  std::unique_ptr<PostgresServer> server;
  std::string data;
};

// A short directory (Unix socket paths are short), removed with the test.
class SweepPostgres : public ::testing::Test {
 protected:
  void SetUp() override {
    auto bin = postgres_bin();
    if (!bin) GTEST_SKIP() << "PostgreSQL's server programs are not installed (tools/install-deps.sh installs them)";
    dir_ = fs::path("/tmp") / ("tpg_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "gate");
    server_ = std::make_unique<PostgresServer>(*bin, dir_ / "pg");
    data_ = (dir_ / "task.h5").string();
    auto made = run_captured({"/usr/bin/python3", TESSERA_SOURCE_DIR "/tools/make_patch_task.py", "--out", data_,
                              "--count", "64", "--size", "16", "--seed", "1"});
    ASSERT_EQ(made.wait_status, 0) << made.errors;
  }
  void TearDown() override {
    server_.reset();
    fs::remove_all(dir_);
  }

  std::unique_ptr<ChildProcess> worker(int trials, double grace) {
    std::vector<std::string> args = {TESSERA_BINARY, "sweep", "--study", server_->url(), "--trials",
                                     std::to_string(trials), "--param", "lr=loguniform:1e-3:1e-1", "--param",
                                     "width=int:4:8", "--heartbeat-grace", std::to_string(grace), "--", "--data",
                                     data_, "--epochs", "1", "--batch", "16"};
    return std::make_unique<ChildProcess>(args, Environment{{"TESSERA_FAULT", "wait:" + (dir_ / "gate").string()}});
  }
  void release(int trial) { std::ofstream(dir_ / "gate" / ("go-" + std::to_string(trial))) << "go\n"; }
  bool started(int trial) { return fs::exists(dir_ / "gate" / ("started-" + std::to_string(trial))); }
  std::vector<Trial> trials() { return StudyStore(server_->url(), StudyStore::Mode::read_only).trials(); }
  bool complete(int trial) {
    auto all = trials();
    return all.size() > static_cast<size_t>(trial) && all[static_cast<size_t>(trial)].state == TrialState::complete;
  }
  // Waits for an event, reading the workers' stderr meanwhile so that they never block on it.
  void wait_for(const std::function<bool()>& event, std::vector<ChildProcess*> workers) {
    while (!event()) {
      for (auto* w : workers)
        if (w) w->read_stderr();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  static int finish(ChildProcess& worker) {
    while (worker.stderr_fd() >= 0 || worker.report_fd() >= 0) {
      worker.read_stderr();
      worker.read_report();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    worker.wait();
    return WIFEXITED(worker.wait_status()) ? WEXITSTATUS(worker.wait_status()) : 128 + WTERMSIG(worker.wait_status());
  }

  fs::path dir_;
  std::unique_ptr<PostgresServer> server_;
  std::string data_;
};

TEST_F(SweepPostgres, TwoWorkersShareOneStudyAndSeeEachOthersTrials) {
  auto first = worker(12, 30), second = worker(12, 30);
  // Each worker runs one trial at a time: trials 0 and 1 waiting at once are one on each.
  wait_for([&] { return started(0) && started(1); }, {first.get(), second.get()});
  release(0);
  wait_for([&] { return complete(0); }, {first.get(), second.get()});
  // The worker of trial 1 claims its next trial after trial 0 is complete.
  release(1);
  wait_for([&] { return complete(1); }, {first.get(), second.get()});
  for (int trial = 2; trial < 12; ++trial) release(trial);
  EXPECT_EQ(finish(*first), 0) << first->stderr_tail();
  EXPECT_EQ(finish(*second), 0) << second->stderr_tail();

  auto all = trials();
  ASSERT_EQ(all.size(), 12u);
  std::set<std::string> workers, params;
  std::map<std::string, int> trials_by_worker;
  for (size_t n = 0; n < all.size(); ++n) {
    EXPECT_EQ(all[n].number, static_cast<int>(n));
    EXPECT_EQ(all[n].state, TrialState::complete) << "trial " << n;
    ASSERT_EQ(all[n].attempts.size(), 1u) << "trial " << n << " was run more than once";
    EXPECT_EQ(all[n].value, all[n].attempts[0].value);
    ++trials_by_worker[all[n].attempts[0].worker];
    params.insert(all[n].params.dump());
  }
  EXPECT_EQ(trials_by_worker.size(), 2u) << "both workers ran trials";
  EXPECT_EQ(params.size(), 12u);
  auto& first_worker = all[0].attempts[0].worker;
  EXPECT_NE(all[1].attempts[0].worker, first_worker);
  // The other worker's sampler was given trial 0, which it did not run.
  bool saw_other = false;
  for (auto& trial : all)
    if (trial.attempts[0].worker != first_worker)
      saw_other = saw_other || std::find(trial.sampler_saw.begin(), trial.sampler_saw.end(), 0) != trial.sampler_saw.end();
  EXPECT_TRUE(saw_other);
  // Every sampler saw every trial finished before it: the last one saw all eleven others.
  size_t most = 0;
  for (auto& trial : all) most = std::max(most, trial.sampler_saw.size());
  EXPECT_GE(most, 10u);
}

TEST_F(SweepPostgres, AKilledWorkersTrialIsRerunByAnotherAfterTheGrace) {
  const double grace = 4;
  auto doomed = worker(3, grace);
  wait_for([&] { return started(0); }, {doomed.get()});
  doomed->send(SIGKILL);
  EXPECT_EQ(finish(*doomed), 128 + SIGKILL);
  auto before = trials();
  ASSERT_EQ(before.size(), 1u);
  EXPECT_EQ(before[0].state, TrialState::running);
  // --show says how long ago the dead worker last beat.
  auto shown = run_captured({TESSERA_BINARY, "sweep", "--study", server_->url(), "--show"});
  EXPECT_NE(shown.output.find("running (beat "), std::string::npos) << shown.output;
  for (int trial = 0; trial < 3; ++trial) release(trial);

  auto survivor = worker(3, grace);
  EXPECT_EQ(finish(*survivor), 0) << survivor->stderr_tail();
  auto all = trials();
  ASSERT_EQ(all.size(), 3u);
  for (auto& trial : all) EXPECT_EQ(trial.state, TrialState::complete) << "trial " << trial.number;
  auto& rerun = all[0];
  ASSERT_EQ(rerun.attempts.size(), 2u);
  EXPECT_EQ(rerun.attempts[0].state, TrialState::interrupted);
  EXPECT_EQ(rerun.attempts[1].state, TrialState::complete);
  EXPECT_NE(rerun.attempts[0].worker, rerun.attempts[1].worker);
  EXPECT_EQ(rerun.value, rerun.attempts[1].value);
  // Not before the grace: its worker had beaten when it started.
  EXPECT_GE(rerun.attempts[1].started - rerun.attempts[0].started, grace - 0.05);
  for (size_t n = 1; n < all.size(); ++n) EXPECT_EQ(all[n].attempts.size(), 1u) << "trial " << n;
}

}  // namespace
}  // namespace tessera::sweep
