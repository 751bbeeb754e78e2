// The subcommands of the tessera binary; each adds itself to the CLI11 app and runs when chosen.
#pragma once
#include <CLI/CLI.hpp>

namespace tessera::cli {

void add_info_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_synth_command(CLI::App& app);
void add_tile_command(CLI::App& app);
void add_sweep_command(CLI::App& app);

}  // namespace tessera::cli
