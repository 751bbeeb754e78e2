// to_half, the one host conversion from float to IEEE binary16 (fp16 feature files, fp16
// uploads): against numpy's float16 over every float bit pattern within 2^15 steps of each power
// of two from 2^-26 to 2^16 (binary16's subnormals, normals and overflow), both signs, and a
// million random patterns; and known values, ties and the round trip of every half.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <unistd.h>
#include <vector>

#include "compute/tensor.h"
#include "sweep/child.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

uint16_t half_of(float value) { return to_half(std::span<const float>(&value, 1))[0]; }

bool is_nan_half(uint16_t half) { return (half & 0x7C00) == 0x7C00 && (half & 0x03FF) != 0; }

TEST(ToHalf, KnownValues) {
  // Rounded up to the power of two above it (HDF5's conversion wrote 0x2400, 0.015625).
  EXPECT_EQ(half_of(0.031249f), 0x2800);
  EXPECT_EQ(half_of(65504.0f), 0x7BFF);                                         // the largest half
  EXPECT_EQ(half_of(std::nextafter(65520.0f, 0.0f)), 0x7BFF);                   // just under the overflow tie
  EXPECT_EQ(half_of(65520.0f), 0x7C00);                                         // the tie rounds to even: inf
  EXPECT_EQ(half_of(-1e30f), 0xFC00);                                           // overflow keeps the sign
  EXPECT_EQ(half_of(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(half_of(std::ldexp(1.0f, -24)), 0x0001);                            // the smallest subnormal
  EXPECT_EQ(half_of(std::ldexp(1.0f, -25)), 0x0000);                            // half of it: a tie, to even 0
  EXPECT_EQ(half_of(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);      // past the tie
  EXPECT_EQ(half_of(std::ldexp(3.0f, -25)), 0x0002);                            // 1.5 subnormal steps: to even 2
  EXPECT_EQ(half_of(std::ldexp(1.0f, -14)), 0x0400);                            // the smallest normal
  EXPECT_EQ(half_of(std::nextafter(std::ldexp(1.0f, -14), 0.0f)), 0x0400);      // rounds up into the normals
  EXPECT_EQ(half_of(1.0f + std::ldexp(1.0f, -11)), 0x3C00);                     // a tie: to even
  EXPECT_EQ(half_of(1.0f + std::ldexp(3.0f, -11)), 0x3C02);                     // a tie: to even, upwards
  EXPECT_EQ(half_of(-0.0f), 0x8000);
  EXPECT_TRUE(is_nan_half(half_of(std::numeric_limits<float>::quiet_NaN())));
}

TEST(ToHalf, EveryPowerOfTwoIsExact) {
  for (int exponent = -24; exponent <= 15; ++exponent)
    for (float sign : {1.0f, -1.0f}) {
      const float value = sign * std::ldexp(1.0f, exponent);
      EXPECT_EQ(from_half(to_half(std::span<const float>(&value, 1)))[0], value) << value;
    }
}

TEST(ToHalf, EveryHalfRoundTrips) {
  std::vector<uint16_t> halves;
  for (uint32_t bits = 0; bits < 0x10000; ++bits)
    if (!is_nan_half(static_cast<uint16_t>(bits))) halves.push_back(static_cast<uint16_t>(bits));
  EXPECT_EQ(to_half(from_half(halves)), halves);
}

TEST(ToHalf, MatchesNumpyNearEveryPowerOfTwo) {
  std::vector<uint32_t> patterns;
  for (int exponent = -26; exponent <= 16; ++exponent)
    for (uint32_t sign : {0u, 0x80000000u}) {
      const uint32_t power = std::bit_cast<uint32_t>(std::ldexp(1.0f, exponent)) | sign;
      for (uint32_t step = 0; step < 0x10000; ++step) patterns.push_back(power - 0x8000 + step);
    }
  const size_t near_powers = patterns.size();
  std::mt19937 random(16);
  for (int i = 0; i < (1 << 20); ++i) patterns.push_back(static_cast<uint32_t>(random()));
  std::vector<float> values(patterns.size());
  std::memcpy(values.data(), patterns.data(), patterns.size() * sizeof(uint32_t));

  const fs::path work = fs::temp_directory_path() / ("tessera_half_" + std::to_string(::getpid()));
  fs::create_directories(work);
  const fs::path floats = work / "floats.bin", halves_path = work / "halves.bin";
  std::ofstream(floats, std::ios::binary)
      .write(reinterpret_cast<const char *>(patterns.data()), static_cast<std::streamsize>(patterns.size() * 4));
  auto numpy = sweep::run_captured(
      {"/usr/bin/python3", "-c",
       "import sys, warnings, numpy as np; warnings.simplefilter('ignore');"
       "np.fromfile(sys.argv[1], '<f4').astype(np.float16).view('<u2').tofile(sys.argv[2])",
       floats.string(), halves_path.string()});
  ASSERT_EQ(numpy.wait_status, 0) << numpy.errors;
  std::vector<uint16_t> expected(patterns.size());
  std::ifstream(halves_path, std::ios::binary)
      .read(reinterpret_cast<char *>(expected.data()), static_cast<std::streamsize>(expected.size() * 2));
  fs::remove_all(work);

  const std::vector<uint16_t> halves = to_half(values);
  size_t differ = 0, shown = 0, nans = 0;
  for (size_t i = 0; i < patterns.size(); ++i) {
    if (is_nan_half(expected[i])) {  // NaN payloads are not compared; NaN stays NaN
      ++nans;
      if (!is_nan_half(halves[i])) ++differ;
      continue;
    }
    if (halves[i] == expected[i]) continue;
    ++differ;
    if (shown++ < 10)
      ADD_FAILURE() << "float bits 0x" << std::hex << patterns[i] << " (" << values[i] << "): to_half 0x" << halves[i]
                    << ", numpy 0x" << expected[i];
  }
  EXPECT_EQ(differ, 0u) << "of " << patterns.size() << " patterns";
  EXPECT_EQ(near_powers, size_t{43} * 2 * 0x10000);
  EXPECT_GT(nans, 0u);  // the random patterns hold NaNs: they stay NaN
}

}  // namespace
}  // namespace tessera
