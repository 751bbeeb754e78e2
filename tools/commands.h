// The subcommands of the tessera binary; each adds itself to the CLI11 app and runs when chosen.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace tessera::cli {

void add_info_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_forward_command(CLI::App& app);
void add_synth_command(CLI::App& app);
void add_tile_command(CLI::App& app);
void add_sweep_command(CLI::App& app);
void add_extract_command(CLI::App& app);
void add_heatmap_command(CLI::App& app);
void add_report_command(CLI::App& app);
void add_doctor_command(CLI::App& app);

// Runs `tessera train ARGS...` inside this process and returns its exit code; each trial
// protocol line (docs/architecture.md, "Trial protocol") goes to `report` instead of a file
// descriptor. Trials run this way share one Vulkan device for the life of the process (the
// sweep's --isolation none).
int run_train_in_process(const std::vector<std::string>& args,
                         const std::function<void(const std::string& json_line)>& report);

}  // namespace tessera::cli
