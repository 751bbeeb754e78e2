#include "data/split.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "common/error.h"
#include "common/units.h"

namespace tessera::data {

namespace {

void add_counts(std::vector<uint64_t>& total, const std::vector<uint64_t>& counts) {
  if (total.size() < counts.size()) total.resize(counts.size());
  for (size_t c = 0; c < counts.size(); ++c) total[c] += counts[c];
}

std::vector<uint64_t> classes_present(const std::vector<uint64_t>& counts) {
  std::vector<uint64_t> present;
  for (size_t c = 0; c < counts.size(); ++c)
    if (counts[c]) present.push_back(c);
  return present;
}

// The group a small cohort holds out when `fraction` holds out none: the one with the most
// classes, then the fewest patches, whose others still hold every class; -1 where none does.
std::ptrdiff_t fallback_group(const PatchSource& source, const std::vector<uint64_t>& groups,
                              const std::vector<size_t>& sizes) {
  std::vector<uint64_t> all;
  for (uint64_t group : groups) add_counts(all, source.class_counts(group));
  std::ptrdiff_t best = -1;
  size_t best_classes = 0;
  for (size_t k = 0; k < groups.size(); ++k) {
    std::vector<uint64_t> held = source.class_counts(groups[k]), rest = all;
    for (size_t c = 0; c < held.size(); ++c) rest[c] -= held[c];
    if (classes_present(rest).size() < classes_present(all).size()) continue;
    const size_t classes = classes_present(held).size();
    if (best < 0 || classes > best_classes ||
        (classes == best_classes && sizes[k] < sizes[static_cast<size_t>(best)])) {
      best = static_cast<std::ptrdiff_t>(k);
      best_classes = classes;
    }
  }
  return best;
}

}  // namespace

GroupSplit split_by_group(const PatchSource& source, double fraction, bool fall_back) {
  size_t n = source.size();
  std::vector<uint64_t> groups;  // in order of first appearance
  std::vector<size_t> sizes;
  std::unordered_map<uint64_t, size_t> position;
  std::vector<size_t> group_of(n);
  for (size_t i = 0; i < n; ++i) {
    auto [found, added] = position.emplace(source.group(i), groups.size());
    if (added) {
      groups.push_back(source.group(i));
      sizes.push_back(0);
    }
    group_of[i] = found->second;
    ++sizes[found->second];
  }
  bool slides = !groups.empty() && !source.group_name(groups[0]).empty();
  const char* unit = slides ? "slides" : "groups";

  // From the last group backwards, each one that brings the held-out count nearer the target.
  double target = fraction * static_cast<double>(n);
  std::vector<bool> held(groups.size(), false);
  size_t taken = 0;
  for (size_t k = groups.size(); fraction > 0 && k-- > 0;) {
    if (taken + sizes[k] >= n) continue;  // training keeps a group
    double now = std::abs(static_cast<double>(taken) - target);
    if (std::abs(static_cast<double>(taken + sizes[k]) - target) < now) {
      held[k] = true;
      taken += sizes[k];
    }
  }

  std::string fallen_back;
  if (fall_back && fraction > 0 && taken == 0 && groups.size() > 1)
    if (std::ptrdiff_t k = fallback_group(source, groups, sizes); k >= 0) {
      held[static_cast<size_t>(k)] = true;
      taken = sizes[static_cast<size_t>(k)];
      fallen_back = "--val-fraction " + format_number(fraction) + " (the default) holds out none of the " +
                    std::to_string(groups.size()) + " " + unit + ", each too large a share: holding out " +
                    (slides ? source.group_name(groups[static_cast<size_t>(k)]) : "one") + " (" +
                    format_number(static_cast<double>(taken) / static_cast<double>(n)) +
                    " of the patches) instead (give --val-fraction to choose)";
    }

  GroupSplit split;
  std::vector<uint64_t> train_classes, val_classes;
  size_t train_groups = 0;
  for (size_t k = 0; k < groups.size(); ++k) {
    add_counts(held[k] ? val_classes : train_classes, source.class_counts(groups[k]));
    if (held[k] && slides) split.held_out.push_back(source.group_name(groups[k]));
    train_groups += !held[k];
  }
  for (size_t i = 0; i < n; ++i) (held[group_of[i]] ? split.validation : split.train).push_back(i);

  std::string asked = "--val-fraction " + format_number(fraction);
  if (fraction > 0 && taken == 0) {
    if (groups.size() == 1)
      throw UsageError(asked + ": validation holds out whole slides, and " + source.description() +
                       " has one slide (it cannot be split): use --val-fraction 0 to train without "
                       "validation, or tile more slides");
    size_t smallest = *std::min_element(sizes.begin(), sizes.end());
    double share = static_cast<double>(smallest) / static_cast<double>(n);
    throw UsageError(asked + " holds out nothing: validation takes whole " + std::string(unit) + ", and the smallest of the " +
                     std::to_string(groups.size()) + " in " + source.description() + " is " + format_number(share) +
                     " of the patches; use --val-fraction 0 to train without validation, or about " + format_number(share));
  }
  auto train_present = classes_present(train_classes), val_present = classes_present(val_classes);
  for (uint64_t c : val_present)
    if (c >= train_classes.size() || train_classes[c] == 0)
      throw UsageError(asked + ": the held-out " + unit + " hold every patch of class " + std::to_string(c) +
                       ", so training would never see it; use another --val-fraction, or tile more slides of class " +
                       std::to_string(c));
  nlohmann::json warnings = nlohmann::json::array();
  if (!fallen_back.empty()) warnings.push_back(fallen_back);
  if (taken > 0 && train_present.size() > 1 && val_present.size() < train_present.size()) {
    std::string missing;
    for (uint64_t c : train_present)
      if (c >= val_classes.size() || val_classes[c] == 0) missing += (missing.empty() ? "" : ", ") + std::to_string(c);
    warnings.push_back("validation holds no patch of class " + missing +
                       (val_present.size() == 1 ? ": its AUC is undefined and its accuracy that of one class" : ""));
  }
  auto side = [&](size_t patches, size_t count, const std::vector<uint64_t>& per_class) {
    nlohmann::json record = {{"patches", patches}, {"per_class", per_class}};
    record[unit] = count;
    return record;
  };
  split.report = {{"val_fraction", fraction},
                  {"held_out_fraction", n ? static_cast<double>(taken) / static_cast<double>(n) : 0.0},
                  {"train", side(n - taken, train_groups, train_classes)},
                  {"validation", side(taken, groups.size() - train_groups, val_classes)},
                  {"warnings", warnings}};
  return split;
}

std::vector<uint64_t> patches_per_class(const nlohmann::json& report) {
  std::vector<uint64_t> total;
  for (const char* side : {"train", "validation"})
    add_counts(total, report.at(side).at("per_class").get<std::vector<uint64_t>>());
  return total;
}

}  // namespace tessera::data
