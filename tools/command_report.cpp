// tessera report: what a tile or extract run on an output did (its run report, OUT/runs), as a
// table; the report's JSON with --json; a self-contained HTML page with --html.
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
  std::string out, run, html;
  bool overwrite = false;
};

}  // namespace

void add_report_command(CLI::App& app) {
  auto flags = std::make_shared<ReportFlags>();
  auto* command = app.add_subcommand(
      "report", "What a tile or extract run did: each slide's status (done, resumed, skipped, failed and why), "
                "tiles, seconds, tiles/s and the device's busy fraction, with totals; the newest run's unless --run");
  auto* out = command->add_option("OUT", flags->out, "A tile store or extract --out: the newest report in its runs/");
  auto* run = command->add_option("--run", flags->run, "One report file (OUT/runs/<start>.json) instead of the newest");
  run->excludes(out);
  command->add_option("--html", flags->html, "Also write the report as one self-contained HTML page");
  command->add_flag("--overwrite", flags->overwrite, "Replace the --html page if it exists");
  command->callback([flags] {
    if (flags->out.empty() && flags->run.empty()) throw UsageError("give OUT (a tile store or extract --out) or --run FILE");
    const std::string file = flags->run.empty() ? run_report_files(flags->out).back() : flags->run;
    const nlohmann::json report = read_run_report(file);
    if (!flags->html.empty()) write_output_file(flags->html, run_report_html(report, file), "--html", flags->overwrite);
    // --json: the report as its file holds it, on one line.
    if (Progress::json())
      std::printf("%s\n", report.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    else
      std::fputs(format_run_report(report, file).c_str(), stdout);
  });
}

}  // namespace tessera::cli
