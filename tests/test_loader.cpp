// The training loader: the split keeps slides apart, the batches of an epoch are a function of
// the seed and the epoch alone (whatever the number of threads), every patch comes once, and
// augmentation moves pixels as a flip and a rotation do.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "common/error.h"
#include "data/loader.h"
#include "data/split.h"

namespace tessera::data {
namespace {

constexpr int kSize = 4;

// Patches in memory: patch i is filled with i % 251, labelled i % 2, on slide i / per_slide.
class MemoryPatches : public PatchSource {
 public:
  MemoryPatches(size_t count, size_t per_slide) : count_(count), per_slide_(per_slide) {}
  size_t size() const override { return count_; }
  int height() const override { return kSize; }
  int width() const override { return kSize; }
  uint32_t class_count() const override { return 2; }
  uint64_t group(size_t index) const override { return index / per_slide_; }
  std::vector<uint64_t> class_counts(uint64_t group) const override {
    std::vector<uint64_t> counts(2, 0);
    for (size_t i = group * per_slide_; i < std::min(count_, (group + 1) * per_slide_); ++i) ++counts[i % 2];
    return counts;
  }
  std::string group_name(uint64_t group) const override { return "slide" + std::to_string(group); }
  uint32_t read(size_t index, uint8_t* rgb) const override {
    if (rgb) std::memset(rgb, static_cast<int>(index % 251), kSize * kSize * 3);
    return static_cast<uint32_t>(index % 2);
  }
  std::string description() const override { return "memory"; }

 private:
  size_t count_, per_slide_;
};

std::vector<size_t> all(size_t n) {
  std::vector<size_t> indices(n);
  for (size_t i = 0; i < n; ++i) indices[i] = i;
  return indices;
}

// The patch index behind each sample of an epoch (pixel value; indices below 251).
std::vector<size_t> epoch_order(const PatchSource& source, const LoaderOptions& options, uint32_t epoch,
                                std::vector<uint32_t>* labels = nullptr) {
  Loader loader(source, all(source.size()), options);
  loader.start_epoch(epoch);
  std::vector<size_t> order;
  Batch batch;
  while (loader.next(batch))
    for (size_t i = 0; i < batch.count; ++i) {
      order.push_back(batch.images[i * kSize * kSize * 3]);
      if (labels) labels->push_back(batch.labels[i]);
    }
  return order;
}

// Slides given as their patches' labels: patch i of the list belongs to the slide that holds it.
class LabelledSlides : public PatchSource {
 public:
  explicit LabelledSlides(std::vector<std::vector<uint32_t>> slides, bool named = true)
      : slides_(std::move(slides)), named_(named) {
    for (uint64_t s = 0; s < slides_.size(); ++s)
      for (uint32_t label : slides_[s]) patches_.push_back({s, label});
  }
  size_t size() const override { return patches_.size(); }
  int height() const override { return kSize; }
  int width() const override { return kSize; }
  uint32_t class_count() const override { return 2; }
  uint64_t group(size_t index) const override { return patches_.at(index).first; }
  std::vector<uint64_t> class_counts(uint64_t group) const override {
    std::vector<uint64_t> counts;
    for (uint32_t label : slides_.at(group)) {
      if (label >= counts.size()) counts.resize(label + 1);
      ++counts[label];
    }
    return counts;
  }
  std::string group_name(uint64_t group) const override { return named_ ? "s" + std::to_string(group) : ""; }
  uint32_t read(size_t index, uint8_t*) const override { return patches_.at(index).second; }
  std::string description() const override { return "memory"; }

 private:
  std::vector<std::vector<uint32_t>> slides_;
  std::vector<std::pair<uint64_t, uint32_t>> patches_;
  bool named_;
};

std::vector<uint32_t> labels(size_t zeros, size_t ones) {
  std::vector<uint32_t> result(zeros, 0);
  result.insert(result.end(), ones, 1);
  return result;
}

TEST(Split, HoldsOutWholeSlidesAsCloseToTheFractionAsTheyAllow) {
  MemoryPatches source(70, 10);  // 7 slides of 10
  auto split = split_by_group(source, 0.3);
  // 21 patches asked: slides 6 and 5 (20) come closer than 6, 5 and 4 (30).
  ASSERT_EQ(split.validation.size(), 20u);
  EXPECT_EQ(split.validation.front(), 50u);
  EXPECT_EQ(split.validation.back(), 69u);
  EXPECT_EQ(split.train.size(), 50u);
  EXPECT_EQ(split.held_out, (std::vector<std::string>{"slide5", "slide6"}));
  EXPECT_EQ(split.report["validation"]["slides"], 2);
  EXPECT_EQ(split.report["validation"]["per_class"], nlohmann::json({10, 10}));
  EXPECT_EQ(split.report["train"]["per_class"], nlohmann::json({25, 25}));
  EXPECT_TRUE(split.report["warnings"].empty());
  std::set<uint64_t> train_slides;
  for (size_t i : split.train) train_slides.insert(source.group(i));
  for (size_t i : split.validation) EXPECT_EQ(train_slides.count(source.group(i)), 0u) << i;
  auto none = split_by_group(source, 0);
  EXPECT_TRUE(none.validation.empty());
  EXPECT_EQ(none.train.size(), 70u);
}

TEST(Split, TwoSlidesHoldOutTheOneNearerTheFractionAndSayWhatItHolds) {
  // 82% and 18% of the patches: 0.1 holds out the small slide, not the large one, whichever is last.
  for (bool small_last : {true, false}) {
    std::vector<std::vector<uint32_t>> slides = {labels(41, 41), labels(18, 0)};
    if (!small_last) std::swap(slides[0], slides[1]);
    auto split = split_by_group(LabelledSlides(slides), 0.1);
    EXPECT_EQ(split.validation.size(), 18u);
    EXPECT_DOUBLE_EQ(split.report["held_out_fraction"].get<double>(), 0.18);
    ASSERT_EQ(split.report["warnings"].size(), 1u);
    EXPECT_NE(split.report["warnings"][0].get<std::string>().find("no patch of class 1"), std::string::npos);
  }
}

TEST(Split, RefusesASplitThatHoldsOutNothingOrTakesAClassFromTraining) {
  auto message = [](const LabelledSlides& source, double fraction) {
    try {
      split_by_group(source, fraction);
    } catch (const UsageError& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  // Two equal slides at 0.1: the nearest split is none.
  EXPECT_NE(message(LabelledSlides({labels(5, 5), labels(5, 5)}), 0.1).find("holds out nothing"), std::string::npos);
  EXPECT_NE(message(LabelledSlides({labels(5, 5)}), 0.3).find("one slide"), std::string::npos);
  // The only slide with class 1 is the one held out.
  EXPECT_NE(message(LabelledSlides({labels(20, 0), labels(20, 0), labels(5, 5)}), 0.2).find("class 1"),
            std::string::npos);
}

TEST(Split, APatchFileHoldsOutItsLastPatches) {
  std::vector<std::vector<uint32_t>> patches;
  for (uint32_t i = 0; i < 113; ++i) patches.push_back({i % 2});
  auto split = split_by_group(LabelledSlides(patches, false), 0.3);
  ASSERT_EQ(split.validation.size(), 34u);  // round(33.9)
  EXPECT_EQ(split.validation.front(), 79u);
  EXPECT_TRUE(split.held_out.empty());
  EXPECT_EQ(split.report["validation"]["groups"], 34);
}

TEST(Loader, EpochsAreTheSameWhateverTheThreadsAndEachPatchComesOnce) {
  MemoryPatches source(100, 100);
  LoaderOptions options;
  options.batch = 8;
  options.drop_last = false;
  options.seed = 5;
  options.workers = 1;
  std::vector<uint32_t> labels;
  auto single = epoch_order(source, options, 0, &labels);
  options.workers = 4;
  auto threaded = epoch_order(source, options, 0);
  EXPECT_EQ(single, threaded);
  ASSERT_EQ(single.size(), 100u);
  std::vector<size_t> sorted = single;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, all(100));
  for (size_t i = 0; i < single.size(); ++i) EXPECT_EQ(labels[i], single[i] % 2);
  EXPECT_NE(single, all(100));                              // shuffled
  EXPECT_NE(single, epoch_order(source, options, 1));       // a new order each epoch
  EXPECT_EQ(threaded, epoch_order(source, options, 0));     // the same again for a resumed run
  options.drop_last = true;
  EXPECT_EQ(epoch_order(source, options, 0).size(), 96u);   // 12 whole batches of 8
}

// Where the one marked pixel of a patch went.
std::pair<int, int> marked(const std::vector<uint8_t>& rgb) {
  auto brightest = std::max_element(rgb.begin(), rgb.end()) - rgb.begin();
  int pixel = static_cast<int>(brightest / 3);
  return {pixel / kSize, pixel % kSize};
}

TEST(Augment, FlipsAndRotationsMovePixelsToEightPlacesAndJitterIsMild) {
  std::vector<uint8_t> patch(kSize * kSize * 3, 100);
  std::fill_n(patch.begin() + (0 * kSize + 1) * 3, 3, 200);  // row 0, column 1: no symmetry keeps it
  std::set<std::pair<int, int>> places;
  for (uint64_t geometry = 0; geometry < 8; ++geometry) {
    uint64_t bits = geometry | (0x40ull << 8) | (0xc0ull << 16) | (0x80ull << 24);
    auto moved = patch;
    augment_patch(moved.data(), kSize, bits);
    places.insert(marked(moved));
    auto again = patch;
    augment_patch(again.data(), kSize, bits);
    EXPECT_EQ(moved, again);
    // Brightness and contrast within 10%: the plain pixels stay equal and near 100.
    auto [row, column] = marked(moved);
    size_t at = static_cast<size_t>(row * kSize + column) * 3;
    uint8_t plain_value = moved[at == 0 ? 3 : 0];
    EXPECT_NEAR(plain_value, 100, 25);
    EXPECT_GT(moved[at], plain_value + 50);
    for (size_t i = 0; i < moved.size(); ++i)
      if (i / 3 != at / 3) {
        EXPECT_EQ(moved[i], plain_value) << i;
      }
  }
  EXPECT_EQ(places.size(), 8u);
  auto plain = patch;
  augment_patch(plain.data(), kSize, 0x80808000ull);  // no flip, no rotation
  EXPECT_EQ(marked(plain), std::make_pair(0, 1));
}

TEST(Loader, AugmentationChangesImagesNotLabels) {
  MemoryPatches source(32, 32);
  LoaderOptions options;
  options.batch = 8;
  options.seed = 3;
  std::vector<uint32_t> plain_labels, augmented_labels;
  auto plain = epoch_order(source, options, 0, &plain_labels);
  options.augment = true;
  Loader loader(source, all(32), options);
  loader.start_epoch(0);
  Batch batch;
  size_t changed = 0, seen = 0;
  while (loader.next(batch))
    for (size_t i = 0; i < batch.count; ++i, ++seen) {
      augmented_labels.push_back(batch.labels[i]);
      changed += batch.images[i * kSize * kSize * 3] != plain[seen] % 251;
    }
  EXPECT_EQ(augmented_labels, plain_labels);
  EXPECT_GT(changed, seen / 2);
}

// A multiplex patch: rotations and flips move whole pixels, all their channels together, and the
// jitter keeps the channels apart (no saturation mixing, which is for RGB).
TEST(Loader, AugmentationMovesEveryChannelOfAPixelTogether) {
  constexpr int size = 6, channels = 5;
  std::vector<uint8_t> patch(size * size * channels);
  for (size_t p = 0; p < size * size; ++p)
    for (size_t c = 0; c < channels; ++c) patch[p * channels + c] = static_cast<uint8_t>(100 + 20 * c + (p == 1 ? 7 : 0));
  for (uint64_t bits : {0x0ull, 0x3ull, 0x5ull, 0x7ull, 0x80808080ull}) {
    auto augmented = patch;
    augment_patch(augmented.data(), size, bits, channels);
    // In each channel one pixel differs from the rest (their median): the same pixel in all.
    std::vector<size_t> marked(channels, SIZE_MAX);
    std::vector<uint8_t> common(channels);
    for (size_t c = 0; c < channels; ++c) {
      std::vector<uint8_t> values;
      for (size_t p = 0; p < size * size; ++p) values.push_back(augmented[p * channels + c]);
      std::nth_element(values.begin(), values.begin() + size * size / 2, values.end());
      common[c] = values[size * size / 2];
      for (size_t p = 0; p < size * size; ++p)
        if (augmented[p * channels + c] != common[c]) {
          EXPECT_EQ(marked[c], SIZE_MAX) << "one marked pixel, bits " << bits;
          marked[c] = p;
        }
    }
    for (size_t c = 1; c < channels; ++c) {
      EXPECT_EQ(marked[c], marked[0]) << "channel " << c << " moved with channel 0, bits " << bits;
      EXPECT_GT(common[c], common[c - 1]) << "channels keep their order, bits " << bits;
    }
  }
}

// Three planes of a multiplex slide are not RGB: each channel is jittered alone, as a patch of
// that channel by itself would be (no saturation, which would mix them).
TEST(Loader, AugmentationKeepsThreePlanesApart) {
  constexpr int size = 5, channels = 3;
  std::vector<uint8_t> patch(size * size * channels);
  for (size_t i = 0; i < patch.size(); ++i) patch[i] = static_cast<uint8_t>((i * 37 + 11) % 251);
  for (uint64_t bits : {0x0ull, 0x6ull, 0x20ff4001ull, 0x11223344ull}) {
    auto planes = patch, as_rgb = patch;
    augment_patch(planes.data(), size, bits, channels, false);
    augment_patch(as_rgb.data(), size, bits, channels, true);
    EXPECT_NE(planes, as_rgb) << "saturation applies to RGB alone, bits " << bits;
    for (int c = 0; c < channels; ++c) {
      std::vector<uint8_t> alone(size * size);
      for (size_t p = 0; p < alone.size(); ++p) alone[p] = patch[p * channels + c];
      augment_patch(alone.data(), size, bits, 1, false);
      for (size_t p = 0; p < alone.size(); ++p)
        ASSERT_EQ(planes[p * channels + c], alone[p]) << "channel " << c << " pixel " << p << " bits " << bits;
    }
  }
}

TEST(Loader, DecodeOnlyReadsThePixelsOfItsPartAndEveryLabel) {
  MemoryPatches source(40, 40);
  LoaderOptions options;
  options.batch = 8;
  options.seed = 5;
  std::vector<uint32_t> plain_labels;
  auto plain = epoch_order(source, options, 1, &plain_labels);
  Loader loader(source, all(40), options);
  loader.decode_only({3, 4});  // samples 3 to 6 of each batch of 8
  loader.start_epoch(1);
  Batch batch;
  std::vector<uint32_t> labels;
  size_t seen = 0, decoded = 0;
  while (loader.next(batch))
    for (size_t i = 0; i < batch.count; ++i, ++seen) {
      labels.push_back(batch.labels[i]);
      uint8_t pixel = batch.images[i * kSize * kSize * 3];
      if (i >= 3 && i < 7) {
        EXPECT_EQ(pixel, plain[seen] % 251) << seen;
        decoded += plain[seen] % 251 != 0;
      } else {
        EXPECT_EQ(pixel, 0) << seen;
      }
    }
  EXPECT_EQ(labels, plain_labels);
  EXPECT_GE(decoded, 19u);  // 20 decoded samples, at most one of them patch 0
}

}  // namespace
}  // namespace tessera::data
