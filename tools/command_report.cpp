// tessera report: what the tile and extract runs on an output did (their run reports, OUT/runs),
// as a table per run and a cohort summary; JSON off a terminal or with --json; an HTML page.
#include <unistd.h>

#include <cstdio>
#include <memory>

#include "common/output.h"
#include "common/progress.h"
#include "common/run_report.h"
#include "tools/commands.h"
#include "tools/run_report_view.h"

namespace tessera::cli {

namespace {

struct ReportFlags {
  std::string path, html;
  bool overwrite = false;
};

}  // namespace

void add_report_command(CLI::App& app) {
  auto flags = std::make_shared<ReportFlags>();
  auto* command = app.add_subcommand(
      "report", "What the tile and extract runs on an output did: each run's slides by status, tiles/s and device "
                "busy fraction, and which slides of the cohort are done or failed last and why");
  command
      ->add_option("OUT", flags->path,
                   "A tile store or extract --out (its runs/ holds a report per run), or one report file")
      ->required();
  command->add_option("--html", flags->html, "Also write the report as one self-contained HTML page");
  command->add_flag("--overwrite", flags->overwrite, "Replace the --html page if it exists");
  command->callback([flags] {
    const RunReports runs = read_run_reports(flags->path);
    if (!flags->html.empty())
      write_output_file(flags->html, run_reports_html(runs, "tessera runs: " + flags->path), "--html",
                        flags->overwrite);
    // Tables for people on a terminal; one JSON object for programs.
    if (Progress::human(STDOUT_FILENO))
      std::fputs(format_run_reports(runs).c_str(), stdout);
    else
      std::printf("%s\n", run_reports_json(runs).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  });
}

}  // namespace tessera::cli
