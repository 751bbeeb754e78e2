// common/json_input.h: JSON from outside parsed within limits, its errors naming the source and
// quoting a short excerpt, and values shown in messages cut short.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "common/json_input.h"

namespace tessera {
namespace {

// The message of the BadInput that parsing `text` throws.
std::string refusal(std::string_view text, const JsonLimits& limits = {}) {
  try {
    parse_json_input(text, "in.json", limits);
  } catch (const BadInput& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted: " << text.substr(0, 100);
  return "";
}

TEST(JsonInput, ParsesWhatNlohmannParses) {
  std::string text = R"({"a": [1, -2, 3.5, true, null, "x\u00e9"], "b": {"c": {}}, "d": []})";
  EXPECT_EQ(parse_json_input(text, "in.json"), nlohmann::json::parse(text));
  EXPECT_EQ(parse_json_input("7", "in.json"), 7);
  EXPECT_EQ(parse_json_input(" \"s\" ", "in.json"), "s");
  EXPECT_EQ(*try_parse_json_input("[1,2]"), nlohmann::json::parse("[1,2]"));
}

TEST(JsonInput, DepthIsLimitedAtEveryLevelCount) {
  auto nested = [](int levels) { return std::string(static_cast<size_t>(levels), '[') + std::string(static_cast<size_t>(levels), ']'); };
  EXPECT_NO_THROW(parse_json_input(nested(64), "in.json"));
  std::string message = refusal(nested(65));
  EXPECT_NE(message.find("in.json: JSON refused: nested deeper than 64 levels (line 1, column 65)"), std::string::npos)
      << message;
  // 100000 levels (a SIGSEGV in any recursive walk of the parsed value): refused as it comes.
  message = refusal(nested(100000));
  EXPECT_NE(message.find("nested deeper than 64 levels"), std::string::npos) << message;
  EXPECT_LT(message.size(), 250u) << message;
  EXPECT_FALSE(try_parse_json_input(nested(100000)));
  // Objects count as levels too.
  std::string objects;
  for (int i = 0; i < 70; ++i) objects += "{\"k\":";
  objects += "1" + std::string(70, '}');
  EXPECT_NE(refusal(objects).find("nested deeper than 64 levels"), std::string::npos);
  EXPECT_NE(refusal(nested(10), {4, 1000}).find("nested deeper than 4 levels"), std::string::npos);
}

TEST(JsonInput, DuplicateKeysAreRefusedNamingTheKey) {
  std::string message = refusal(R"({"w": {"x": 1}, "v": 2, "w": 3})");
  EXPECT_NE(message.find("the key \"w\" is given twice in one object (line 1, column 27)"), std::string::npos)
      << message;
  // The same key in two objects is not a duplicate.
  EXPECT_NO_THROW(parse_json_input(R"([{"a": 1}, {"a": 2}, {"b": {"a": 3}}])", "in.json"));
  EXPECT_FALSE(try_parse_json_input(R"({"a": 1, "a": 1})"));
}

TEST(JsonInput, ValueCountAndRangeAreLimited) {
  EXPECT_NE(refusal("[1,2,3,4]", {64, 4}).find("more than 4 values"), std::string::npos);
  EXPECT_NO_THROW(parse_json_input("[1,2,3]", "in.json", {64, 4}));
  EXPECT_NE(refusal("[1e999]").find("a number beyond the range of a double"), std::string::npos);
  EXPECT_NE(refusal("[-1e400]").find("a number beyond the range of a double"), std::string::npos);
  std::string digits = "[1" + std::string(1 << 20, '0') + "]";
  EXPECT_LT(refusal(digits).size(), 300u);
}

TEST(JsonInput, ErrorsQuoteAShortExcerptNeverTheInput) {
  // A long string with a control character at its end: nlohmann's own message quotes the whole
  // token ("last read: ..."); ours quotes the bytes around it.
  std::string text = "{\"name\": \"" + std::string(1 << 20, 'a') + "\x01\"}";
  std::string message = refusal(text);
  EXPECT_LT(message.size(), 300u) << message.substr(0, 400);
  EXPECT_NE(message.find("in.json: not valid JSON: syntax error while parsing value - invalid string: control "
                         "character U+0001 (SOH) must be escaped"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("near \"...aaaa"), std::string::npos) << message;
  EXPECT_NE(message.find("\\x01\"}\""), std::string::npos) << message;  // the byte escaped, the rest after it
  // Invalid UTF-8 is escaped; valid UTF-8 shown as it is.
  message = refusal("[\"caf\xc3\xa9\", \"\xe9t\xe9\"]");
  EXPECT_NE(message.find("ill-formed UTF-8 byte"), std::string::npos) << message;
  EXPECT_NE(message.find("caf\xc3\xa9\", \"\\xe9t\\xe9\"]"), std::string::npos) << message;
  EXPECT_NO_THROW((void)nlohmann::json(message).dump());  // valid UTF-8: it can go out as JSON
  // Truncated input and trailing bytes.
  EXPECT_NE(refusal("{\"a\": [1, 2").find("unexpected end of input"), std::string::npos);
  EXPECT_NE(refusal("[1] x").find("expected end of input"), std::string::npos);
  EXPECT_NE(refusal("").find("in.json: not valid JSON: "), std::string::npos);
  // The line and column of a later line.
  EXPECT_NE(refusal("{\n  \"a\": 1,\n  \"b\": ]\n}").find("(line 3, column 8)"), std::string::npos);
}

TEST(JsonInput, ExcerptsAreShortAndValidUtf8) {
  EXPECT_EQ(quoted_excerpt("plain"), "plain");
  EXPECT_EQ(quoted_excerpt("a\nb\xff"), "a\\x0ab\\xff");
  EXPECT_EQ(quoted_excerpt(std::string(200, 'x')), std::string(80, 'x') + "...");
  EXPECT_EQ(quoted_excerpt("\xc3\xa9\xc3\xa9", 3), "\xc3\xa9...");  // never half a character
  nlohmann::json big = nlohmann::json::array();
  for (int i = 0; i < 100000; ++i) big.push_back({{"name", "tensor." + std::to_string(i)}, {"shape", {i, 3}}});
  std::string shown = json_excerpt(big);
  EXPECT_LE(shown.size(), 83u);
  EXPECT_EQ(shown.substr(0, 31), R"([{"name":"tensor.0","shape":[0,)");
  EXPECT_EQ(shown.substr(shown.size() - 3), "...");
  EXPECT_EQ(json_excerpt({{"a", 1}, {"b", "x"}}), R"({"a":1,"b":"x"})");
  EXPECT_EQ(json_excerpt(nlohmann::json(std::string("\xe9\xe9"))), "\"\\xe9\\xe9\"");
  // A value nested far deeper than any parse allows (built in code): cut, not a deep recursion.
  nlohmann::json deep = nlohmann::json::array();
  for (int i = 0; i < 100; ++i) deep = nlohmann::json::array({deep});
  EXPECT_EQ(json_excerpt(deep), std::string(80, '[') + "...");
}

TEST(JsonInput, FilesOverTheirSizeAreRefusedBeforeReading) {
  auto path = std::filesystem::temp_directory_path() / ("tessera_json_input_" + std::to_string(getpid()) + ".json");
  std::ofstream(path) << "{\"a\": [1, 2, 3]}";
  EXPECT_EQ(read_json_file(path.string(), "--thing x.json", 100), nlohmann::json::parse("{\"a\": [1, 2, 3]}"));
  try {
    read_json_file(path.string(), "--thing x.json", 10);
    ADD_FAILURE() << "accepted";
  } catch (const BadInput& e) {
    EXPECT_STREQ(e.what(), "--thing x.json: 16 bytes, more than the 10 such a file may hold");
  }
  std::filesystem::remove(path);
  EXPECT_THROW(read_json_file(path.string(), "x.json", 100), BadInput);
  EXPECT_THROW(read_json_file(path.parent_path().string(), "x.json", 100), BadInput);
}

}  // namespace
}  // namespace tessera
