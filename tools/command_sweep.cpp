// tessera sweep (being built; see the issue that owns it).
#include "tools/commands.h"

namespace tessera::cli {

void add_sweep_command(CLI::App& app) { app.add_subcommand("sweep", "(not built yet)"); }

}  // namespace tessera::cli
