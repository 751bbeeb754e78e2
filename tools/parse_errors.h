// What tessera says when its command line does not parse: CLI11's message, and for a flag or
// command it does not know, the nearest one it does ("--lrate": did you mean --lr?).
#pragma once
#include <CLI/CLI.hpp>

#include <string>

namespace tessera::cli {

// The message for `error`, raised while `app` parsed a command line.
std::string explain_parse_error(const CLI::App& app, const CLI::ParseError& error);

}  // namespace tessera::cli
