// Training and validation from one PatchSource: whole groups (slides) held out, as close to the
// fraction asked as the slides' sizes allow, and a report of what went where.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/patches.h"

namespace tessera::data {

struct GroupSplit {
  std::vector<size_t> train, validation;  // patch indices, ascending
  std::vector<std::string> held_out;      // the held-out slides' names (none for a patch file)
  // The numbers: fraction asked and held out; patches, slides and patches per class on each side;
  // "warnings" when validation lacks a class the data has.
  nlohmann::json report;
};

// Holds out the groups (slides), taken from the last one backwards, whose patches come closest to
// `fraction` of all, keeping at least one group for training; a source whose every patch is its
// own group (a patch file) holds out its last round(fraction * N) patches. Throws UsageError
// naming --val-fraction when a fraction above 0 holds out nothing (one slide, or every slide too
// large) or leaves training without a class the data has. With `fall_back` (the fraction is
// train's default, not asked for), a small cohort whose slides are each too large for it holds
// out one slide instead (the one with the most classes, then the fewest patches, that leaves
// training every class) and a warning says so.
GroupSplit split_by_group(const PatchSource& source, double fraction, bool fall_back = false);

// The classes with patches in the split's report ("per_class" of both sides together).
std::vector<uint64_t> patches_per_class(const nlohmann::json& report);

}  // namespace tessera::data
