// tessera: CNN training for gigapixel histopathology on Vulkan compute.
#include <cstdio>
#include <exception>
#include <string>

#include "common/error.h"
#include "common/library_warnings.h"
#include "common/progress.h"
#include "common/version.h"
#include "data/library_messages.h"
#include "tools/commands.h"
#include "tools/parse_errors.h"

int main(int argc, char** argv) {
  // Before any library runs: what libtiff, libvips, OpenSlide, DCMTK and HDF5 would print becomes
  // tessera's own warnings and errors, naming the file.
  tessera::data::capture_library_messages();
  CLI::App app{"tessera: CNN training for gigapixel histopathology on Vulkan compute shaders"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("tessera ") + tessera::version() + " (commit " + tessera::commit() + ")");
  // Progress and results: readable on a terminal, JSON lines otherwise or with --json (before or after the command).
  bool json = false;
  app.add_flag("--json", json, "JSON lines on stderr (and a command's result on stdout), even on a terminal");
  app.fallthrough();
  app.parse_complete_callback([&app, &json] {
    tessera::Progress::set_json(json);
    for (const CLI::App* command : app.get_subcommands()) tessera::set_library_warning_task(command->get_name());
  });
  tessera::cli::add_info_command(app);
  tessera::cli::add_train_command(app);
  tessera::cli::add_forward_command(app);
  tessera::cli::add_synth_command(app);
  tessera::cli::add_tile_command(app);
  tessera::cli::add_sweep_command(app);
  tessera::cli::add_extract_command(app);
  tessera::cli::add_heatmap_command(app);
  tessera::cli::add_report_command(app);
  tessera::cli::add_doctor_command(app);
  try {
    app.parse(argc, argv);
    tessera::report_repeated_library_warnings();
  } catch (const CLI::ParseError& e) {
    // CLI11 exits 0 for --help and 106+ for errors; tessera's contract is 2 for bad usage.
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "%s\n", tessera::cli::explain_parse_error(app, e).c_str());
    return static_cast<int>(tessera::ExitCode::bad_usage);
  } catch (const std::exception& e) {
    tessera::report_repeated_library_warnings();
    std::fprintf(stderr, "tessera: %s\n", e.what());
    return tessera::exit_code_of(e);
  }
  return 0;
}
