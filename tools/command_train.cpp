// tessera train (being built; see the issue that owns it).
#include "tools/commands.h"

namespace tessera::cli {

void add_train_command(CLI::App& app) { app.add_subcommand("train", "(not built yet)"); }

}  // namespace tessera::cli
