// common/run_report.h: a run's report file takes a name no other run's report has, is replaced
// only by its own run's later writes, is never written through a link, and the newest is found
// by start time whatever the "-N" of runs that started in the same millisecond.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <iterator>
#include <fstream>

#include "common/error.h"
#include "common/run_report.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

class RunReportFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("tessera_run_report_file_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "out");
  }
  void TearDown() override { fs::remove_all(root_); }

  static nlohmann::json read(const std::string& path) {
    std::ifstream in(path);
    return nlohmann::json::parse(in);
  }

  fs::path root_;
};

// 2026-11-27T10:15:00.123Z
const std::chrono::system_clock::time_point started{std::chrono::milliseconds(1795774500123)};

TEST_F(RunReportFileTest, NamesByStartInUtcToTheMillisecond) {
  EXPECT_EQ(utc_time(started), "2026-11-27T10:15:00.123Z");
  EXPECT_EQ(utc_time(started, true), "20261127T101500.123Z");
}

TEST_F(RunReportFileTest, NothingWhileTheOutputDoesNotExist) {
  RunReportFile file((root_ / "missing").string(), started);
  EXPECT_EQ(file.write({{"n", 1}}), "");
  EXPECT_FALSE(fs::exists(root_ / "missing"));
}

TEST_F(RunReportFileTest, AnotherRunsReportIsNeverReplaced) {
  const std::string out = (root_ / "out").string();
  RunReportFile first(out, started), second(out, started);
  const std::string first_path = first.write({{"run", 1}, {"slides", 0}});
  EXPECT_EQ(first_path, out + "/runs/20261127T101500.123Z.json");
  const std::string second_path = second.write({{"run", 2}, {"slides", 0}});
  EXPECT_EQ(second_path, out + "/runs/20261127T101500.123Z-2.json");
  EXPECT_EQ(read(first_path)["run"], 1);
  // Later writes replace the run's own file, and only it.
  EXPECT_EQ(first.write({{"run", 1}, {"slides", 3}}), first_path);
  EXPECT_EQ(read(first_path)["slides"], 3);
  EXPECT_EQ(read(second_path)["slides"], 0);
  // No temporary is left beside them.
  EXPECT_EQ(std::distance(fs::directory_iterator(out + "/runs"), fs::directory_iterator()), 2);
  // The newest: the later start, then the later "-N" of the same start; temporaries are not reports.
  RunReportFile later(out, started + std::chrono::seconds(1));
  const std::string later_path = later.write({{"run", 3}});
  std::ofstream(out + "/runs/.20261127T101502.000Z-1.partial") << "{";
  EXPECT_EQ(run_report_files(out), (std::vector<std::string>{first_path, second_path, later_path}));
}

TEST_F(RunReportFileTest, NeverWritesThroughALink) {
  fs::create_directories(root_ / "elsewhere");
  fs::create_directory_symlink(root_ / "elsewhere", root_ / "out" / "runs");
  RunReportFile file((root_ / "out").string(), started);
  try {
    file.write({{"run", 1}});
    FAIL() << "wrote through a link";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::runtime_error);
    EXPECT_NE(std::string(e.what()).find("runs: not a folder"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_empty(root_ / "elsewhere"));
}

TEST_F(RunReportFileTest, AStoreInOneFileKeepsItsReportsBesideIt) {
  std::ofstream(root_ / "tiles.lmdb") << "x";
  EXPECT_EQ(runs_directory((root_ / "tiles.lmdb").string()), (root_ / "tiles.lmdb").string() + ".runs");
  EXPECT_EQ(runs_directory((root_ / "out").string()), (root_ / "out" / "runs").string());
}

TEST_F(RunReportFileTest, NoReportsIsBadInputNamingTheOutput) {
  try {
    run_report_files((root_ / "out").string());
    FAIL() << "no reports accepted";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find((root_ / "out").string()), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera
