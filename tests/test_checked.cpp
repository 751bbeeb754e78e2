// common/checked.h: sizes from files and flags never wrap. Each refusal is the error of its
// source (BadInput, exit 5, for a file; UsageError, exit 2, for a flag) naming the file and the
// field, and the values at the edges of each type pass unchanged.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "common/checked.h"
#include "common/error.h"
#include "common/utf8.h"

namespace tessera {
namespace {

const Field kFile("slide.ome.tiff", "OME-XML Pixels SizeC");
const Field kFlag = Field::flag("--size");

// The message of what `call` throws as `Expected`, or a failure.
template <class Expected, class Call>
std::string refusal(Call call) {
  try {
    call();
  } catch (const Expected& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw another error: " << e.what();
    return "";
  }
  ADD_FAILURE() << "did not throw";
  return "";
}

TEST(Checked, MultiplyAtTheEdges) {
  EXPECT_EQ(multiply<uint64_t>(uint64_t{1} << 32, (uint64_t{1} << 32) - 1, kFile), UINT64_MAX - UINT32_MAX);
  EXPECT_EQ(multiply<int64_t>(INT64_MAX, 1, kFile), INT64_MAX);
  EXPECT_EQ(multiply<int64_t>(INT64_MIN, 1, kFile), INT64_MIN);
  EXPECT_EQ(multiply<int32_t>(46340, 46340, kFile), 2147395600);
  EXPECT_EQ(multiply<uint32_t>(0, UINT32_MAX, kFile), 0u);
  // 2^32 x 2^32 wraps to 0, and 274177 x 67280421310721 to 1, in 64 bits: both refused.
  std::string message = refusal<BadInput>([] { multiply<uint64_t>(uint64_t{1} << 32, uint64_t{1} << 32, kFile); });
  EXPECT_EQ(message,
            "slide.ome.tiff: OME-XML Pixels SizeC overflows: 4294967296 x 4294967296 lies outside 0 to "
            "18446744073709551615");
  refusal<BadInput>([] { multiply<uint64_t>(274177, 67280421310721, kFile); });
  refusal<BadInput>([] { multiply<int32_t>(46341, 46341, kFile); });
  refusal<BadInput>([] { multiply<int64_t>(INT64_MIN, -1, kFile); });
  refusal<BadInput>([] { multiply<int64_t>(-(int64_t{1} << 32), int64_t{1} << 32, kFile); });
}

TEST(Checked, AddAtTheEdges) {
  EXPECT_EQ(add<uint32_t>(UINT32_MAX - 1, 1, kFile), UINT32_MAX);
  EXPECT_EQ(add<int64_t>(INT64_MIN, INT64_MAX, kFile), -1);
  std::string message = refusal<BadInput>([] { add<uint32_t>(UINT32_MAX, 1, kFile); });
  EXPECT_NE(message.find("4294967295 + 1"), std::string::npos) << message;
  refusal<BadInput>([] { add<int64_t>(INT64_MAX, 1, kFile); });
  refusal<BadInput>([] { add<int64_t>(INT64_MIN, -1, kFile); });
}

TEST(Checked, NarrowRefusesWhatTheTypeCannotHold) {
  EXPECT_EQ(narrow<uint8_t>(255, kFile), 255);
  EXPECT_EQ(narrow<uint8_t>(0, kFile), 0);
  EXPECT_EQ(narrow<int32_t>(int64_t{INT32_MIN}, kFile), INT32_MIN);
  EXPECT_EQ(narrow<uint64_t>(int64_t{INT64_MAX}, kFile), uint64_t{INT64_MAX});
  // 300 channels were stored as 44 (300 mod 256); a negative IFD became a huge unsigned one.
  EXPECT_EQ(refusal<BadInput>([] { narrow<uint8_t>(300, kFile); }),
            "slide.ome.tiff: OME-XML Pixels SizeC is 300, not from 0 to 255");
  EXPECT_EQ(refusal<BadInput>([] { narrow<uint32_t>(-1, kFile); }),
            "slide.ome.tiff: OME-XML Pixels SizeC is -1, not from 0 to 4294967295");
  refusal<BadInput>([] { narrow<int32_t>(uint64_t{1} << 31, kFile); });
  refusal<BadInput>([] { narrow<uint64_t>(int64_t{-1}, kFile); });
}

TEST(Checked, WithinNamesTheRangeAndWhy) {
  EXPECT_EQ(within(1, 1, 255, kFile), 1);
  EXPECT_EQ(within(255, 1, 255, kFile), 255);
  EXPECT_EQ(refusal<BadInput>([] { within(int64_t{200000000}, 1, 255, kFile, "channels a tile header holds"); }),
            "slide.ome.tiff: OME-XML Pixels SizeC is 200000000, not from 1 to 255 (channels a tile header holds)");
  refusal<BadInput>([] { within(0, 1, 255, kFile); });
}

TEST(Checked, FlagsAreUsageErrors) {
  EXPECT_EQ(refusal<UsageError>([] { within(0, 8, 65535, kFlag); }), "--size is 0, not from 8 to 65535");
  EXPECT_EQ(exit_code_of(UsageError("x")), 2);
  try {
    multiply<int64_t>(INT64_MAX, 2, kFlag);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::bad_usage);
  }
  try {
    multiply<int64_t>(INT64_MAX, 2, kFile);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::bad_input);
  }
  EXPECT_EQ(kFile.renamed("OME-XML Pixels SizeZ").describe(), "slide.ome.tiff: OME-XML Pixels SizeZ");
  EXPECT_TRUE(kFlag.renamed("--size 9").is_flag());
}

TEST(Checked, RoundedRefusesNonFiniteAndOutOfRange) {
  EXPECT_EQ(rounded<int>(2.5, kFile), 3);
  EXPECT_EQ(rounded<int>(-2.5, kFile), -3);
  EXPECT_EQ(rounded<int>(2147483647.4, kFile), INT32_MAX);
  EXPECT_EQ(rounded<int64_t>(-9223372036854775808.0, kFile), INT64_MIN);
  EXPECT_EQ(rounded<int>(448.0, kFile, 1, 8192), 448);
  // A read size from a pixel size of 6.5e-9 um: 1.7e10 pixels, which an int held as 0.
  EXPECT_EQ(refusal<BadInput>([] { rounded<int>(17179869184.0, kFile, 1, 8192); }),
            "slide.ome.tiff: OME-XML Pixels SizeC is 1.71799e+10, not a number from 1 to 8192");
  refusal<BadInput>([] { rounded<int>(2147483647.5, kFile); });
  refusal<BadInput>([] { rounded<int64_t>(9223372036854775808.0, kFile); });
  refusal<BadInput>([] { rounded<uint64_t>(1e300, kFile); });
  refusal<BadInput>([] { rounded<int>(std::numeric_limits<double>::quiet_NaN(), kFile); });
  refusal<BadInput>([] { rounded<int>(std::numeric_limits<double>::infinity(), kFile); });
  refusal<BadInput>([] { rounded<uint32_t>(-0.6, kFile); });
  EXPECT_EQ(rounded<uint32_t>(-0.4, kFile), 0u);
}

TEST(Utf8, InvalidBytesBecomeReplacementCharacters) {
  EXPECT_EQ(valid_utf8("DAPI"), "DAPI");
  EXPECT_EQ(valid_utf8("Caf\xc3\xa9"), "Caf\xc3\xa9");                                            // é in UTF-8 stays
  EXPECT_EQ(valid_utf8("Caf\xe9"), "Caf\xEF\xBF\xBD");                                            // é in Latin-1
  EXPECT_EQ(valid_utf8("\xc0\xaf"), "\xEF\xBF\xBD\xEF\xBF\xBD");                                  // an overlong '/'
  EXPECT_EQ(valid_utf8("\xed\xa0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");                  // a surrogate
  EXPECT_EQ(valid_utf8("\xf4\x90\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // past U+10FFFF
  EXPECT_EQ(valid_utf8("\xf0\x9f\x94\xac"), "\xf0\x9f\x94\xac");                                  // U+1F52C stays
  EXPECT_EQ(valid_utf8("a\xe2\x82"), "a\xEF\xBF\xBD\xEF\xBF\xBD");                                // cut short
  EXPECT_TRUE(is_valid_utf8("\xce\xbcm"));
  EXPECT_FALSE(is_valid_utf8("caf\xe9.svs"));
}

}  // namespace
}  // namespace tessera
