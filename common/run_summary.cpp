#include "common/run_summary.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>

#include "common/progress.h"

namespace tessera {

namespace {

std::string whole(double value) { return std::to_string(std::llround(value)); }

std::string rate(const nlohmann::json& slide) {
  return slide.contains("tiles_per_second") ? whole(slide["tiles_per_second"].get<double>()) : "-";
}

}  // namespace

void print_result(const nlohmann::json& result, const std::string& readable) {
  std::fflush(stderr);  // after the bar and the slides' lines
  if (Progress::human(STDOUT_FILENO))
    std::fputs(readable.c_str(), stdout);
  else
    std::printf("%s\n", result.dump().c_str());
  std::fflush(stdout);
}

std::string slide_line(const nlohmann::json& slide) {
  std::string line = slide.value("slide", std::string("?")) + "  " + slide.value("status", std::string("?"));
  if (slide.contains("error")) return line + ": " + slide["error"].get<std::string>();
  if (slide.value("resumed_from", uint64_t{0}) > 0) line += " from tile " + format_number(slide["resumed_from"]);
  if (slide.contains("tiles")) line += "  " + format_number(slide["tiles"]) + " tiles";
  if (slide.value("corrupt_tiles", uint64_t{0}) > 0) line += " (" + format_number(slide["corrupt_tiles"]) + " corrupt)";
  if (slide.contains("seconds")) line += "  " + format_duration(slide["seconds"].get<double>(), true);
  if (slide.contains("tiles_per_second")) line += "  " + rate(slide) + " tiles/s";
  return line;
}

nlohmann::json slide_event(const nlohmann::json& slide) {
  nlohmann::json record = {{"event", "slide"}};
  for (const char* key : {"slide", "status", "error", "tiles", "resumed_from", "corrupt_tiles", "seconds",
                          "tiles_per_second"})
    if (slide.contains(key)) record[key] = slide[key];
  return record;
}

std::string slides_table(const nlohmann::json& slides, uint64_t tiles_done, double seconds) {
  std::vector<std::vector<std::string>> rows;
  uint64_t tiles = 0;
  for (const nlohmann::json& slide : slides) {
    if (slide.contains("tiles")) tiles += slide["tiles"].get<uint64_t>();
    rows.push_back({slide.value("slide", std::string("?")), slide.value("status", std::string("?")),
                    slide.contains("tiles") ? format_number(slide["tiles"]) : "-",
                    slide.contains("seconds") ? format_duration(slide["seconds"].get<double>(), true) : "-",
                    rate(slide)});
  }
  rows.push_back({"total", std::to_string(slides.size()) + (slides.size() == 1 ? " slide" : " slides"),
                  std::to_string(tiles), format_duration(seconds, true),
                  seconds > 0 && tiles_done > 0 ? whole(static_cast<double>(tiles_done) / seconds) : "-"});
  return aligned_table({{"slide"}, {"status"}, {"tiles", true}, {"time", true}, {"tiles/s", true}}, rows, true);
}

}  // namespace tessera
