// tessera tile (being built; see the issue that owns it).
#include "tools/commands.h"

namespace tessera::cli {

void add_tile_command(CLI::App& app) { app.add_subcommand("tile", "(not built yet)"); }

}  // namespace tessera::cli
