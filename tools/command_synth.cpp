// tessera synth (being built; see the issue that owns it).
#include "tools/commands.h"

namespace tessera::cli {

void add_synth_command(CLI::App& app) { app.add_subcommand("synth", "(not built yet)"); }

}  // namespace tessera::cli
