// tessera: CNN training for gigapixel histopathology on Vulkan compute.
#include <cstdio>
#include <exception>

#include "common/error.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"tessera: CNN training for gigapixel histopathology on Vulkan compute shaders"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tessera 0.1.0");
  tessera::cli::add_info_command(app);
  tessera::cli::add_train_command(app);
  tessera::cli::add_forward_command(app);
  tessera::cli::add_synth_command(app);
  tessera::cli::add_tile_command(app);
  tessera::cli::add_sweep_command(app);
  tessera::cli::add_extract_command(app);
  tessera::cli::add_heatmap_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 exits 0 for --help and 106+ for errors; tessera's contract is 2 for bad usage.
    int code = app.exit(e);
    return code == 0 ? 0 : static_cast<int>(tessera::ExitCode::bad_usage);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera: %s\n", e.what());
    return tessera::exit_code_of(e);
  }
  return 0;
}
