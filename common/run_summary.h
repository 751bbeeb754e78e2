// The lines a command prints about its slides and, when it ends, its result: on a terminal a
// readable line per slide and a short table; otherwise (or with --json) the JSON records.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace tessera {

// A command's result: the readable text on a terminal (stdout), else `result` as one JSON line.
void print_result(const nlohmann::json& result, const std::string& readable);

// A slide's summary for people ("s1.tiff  tiled  96 tiles  1.2s  80 tiles/s", "s2.svs  failed:
// why"), from the record of tile or extract (`slide`, `status`, `tiles`, `seconds`...).
std::string slide_line(const nlohmann::json& slide);

// The JSON record of a slide's summary: `event` "slide" and the fields slide_line shows.
nlohmann::json slide_event(const nlohmann::json& slide);

// The slides' records as a table (slide, status, tiles, time, tiles/s) and their totals under a
// rule: the tiles summed, the run's `seconds`, and its rate of the `tiles_done` in this run.
std::string slides_table(const nlohmann::json& slides, uint64_t tiles_done, double seconds);

}  // namespace tessera
