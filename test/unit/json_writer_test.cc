#include "base/json_writer.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

namespace vfio_dra {
namespace {

using json = nlohmann::json;

// What nlohmann::json reads back is what was written, and the layout is the one dump(indent)
// gives for the same document (members in the order written).
TEST(JsonWriter, WritesWhatNlohmannReadsBackInDumpsLayout) {
  for (int indent : {-1, 0, 1, 2}) {
    JsonWriter w(indent);
    w.BeginObject();
    w.Key("version");
    w.Int(2);
    w.Key("negative");
    w.Int(-9007199254740993LL);
    w.Key("name");
    w.String("vm-gpu");
    w.Key("flags");
    w.BeginArray();
    w.Bool(true);
    w.Bool(false);
    w.EndArray();
    w.Key("empty object");
    w.BeginObject();
    w.EndObject();
    w.Key("empty array");
    w.StringArray({});
    w.Key("names");
    w.StringArray({"a", "b"});
    w.Key("value");
    w.Value(json::parse(R"({"string": "0000:3b:00.0", "list": [1, -2, 3.5, null, false, "x"],
                            "big": 18446744073709551615, "empty": {}})"));
    w.Key("nested");
    w.BeginArray();
    w.BeginObject();
    w.Key("k");
    w.String("v");
    w.EndObject();
    w.BeginArray();
    w.EndArray();
    w.EndArray();
    w.EndObject();
    EXPECT_FALSE(w.replaced());
    const std::string text = w.Take();
    // The same document in the order written (Value's members in nlohmann's sorted order).
    const auto expected = nlohmann::ordered_json::parse(R"({"version": 2,
        "negative": -9007199254740993, "name": "vm-gpu", "flags": [true, false],
        "empty object": {}, "empty array": [], "names": ["a", "b"],
        "value": {"big": 18446744073709551615, "empty": {},
                  "list": [1, -2, 3.5, null, false, "x"], "string": "0000:3b:00.0"},
        "nested": [{"k": "v"}, []]})");
    EXPECT_EQ(text, expected.dump(indent)) << "indent " << indent;
  }
}

TEST(JsonWriter, TakeEmptiesTheWriter) {
  JsonWriter w;
  w.StringArray({"x"});
  EXPECT_EQ(w.Take(), R"(["x"])");
  w.Int(7);
  EXPECT_EQ(w.Take(), "7");
}

// Every string round-trips through nlohmann's parser: escapes for what JSON requires, UTF-8 kept.
TEST(AppendJsonString, EscapesWhatJsonRequiresAndKeepsUtf8) {
  const std::string cases[] = {
      "",
      "plain",
      "quote \" and backslash \\",
      std::string("nul \0 here", 10),
      "\n\t\r\b\f \x01\x1f\x7f",
      "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80",  // é € 😀
      "edge \xED\x9F\xBF \xEE\x80\x80 \xF4\x8F\xBF\xBF \xF0\x90\x80\x80",
  };
  for (const std::string& value : cases) {
    std::string out;
    EXPECT_TRUE(AppendJsonString(out, value)) << out;
    EXPECT_EQ(json::parse(out).get<std::string>(), value) << out;
  }
  std::string out;
  AppendJsonString(out, std::string("\x01\x1f", 2));
  EXPECT_EQ(out, R"("\u0001\u001f")");
}

// Bytes that are not UTF-8 (cut sequences, overlong forms, surrogates, past U+10FFFF) become
// U+FFFD, one per byte that is not part of a valid sequence, so the text always parses; the
// writer says it replaced something.
TEST(AppendJsonString, ReplacesWhatIsNotUtf8) {
  const std::pair<std::string, std::string> cases[] = {
      {"a\xFFz", "a\xEF\xBF\xBDz"},
      {"cut \xC3", "cut \xEF\xBF\xBD"},
      {"cut \xE2\x82", "cut \xEF\xBF\xBD\xEF\xBF\xBD"},
      {"overlong \xC0\xAF", "overlong \xEF\xBF\xBD\xEF\xBF\xBD"},
      {"overlong \xE0\x80\xAF", "overlong \xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
      {"surrogate \xED\xA0\x80", "surrogate \xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
      {"too high \xF4\x90\x80\x80", "too high \xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
      {"latin-1 caf\xE9!", "latin-1 caf\xEF\xBF\xBD!"},
      {"lead then ascii \xC3"
       "A",
       "lead then ascii \xEF\xBF\xBD"
       "A"},
      {"overlong \xF0\x8F\xBF\xBF", "overlong \xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
      {"\xF5\xFF", "\xEF\xBF\xBD\xEF\xBF\xBD"},
      {"bad third \xE0\xA0"
       "A",
       "bad third \xEF\xBF\xBD\xEF\xBF\xBD"
       "A"},
      {"cut at the end \xF0\x9F\x98", "cut at the end \xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
  };
  for (const auto& [value, expected] : cases) {
    std::string out;
    EXPECT_FALSE(AppendJsonString(out, value)) << out;
    json parsed;
    ASSERT_NO_THROW(parsed = json::parse(out)) << out;
    EXPECT_EQ(parsed.get<std::string>(), expected) << out;
  }
}

TEST(JsonWriter, SaysWhenItReplacedBytesThatAreNotUtf8) {
  JsonWriter w;
  w.BeginObject();
  w.StringMember("driver", "ixgbe");
  EXPECT_FALSE(w.replaced());
  w.StringMember("override", "\xFF");
  EXPECT_TRUE(w.replaced());
  w.EndObject();
  EXPECT_EQ(w.Take(), "{\"driver\":\"ixgbe\",\"override\":\"\xEF\xBF\xBD\"}");
  EXPECT_FALSE(w.replaced()) << "Take starts afresh";
  w.BeginObject();
  w.Key("\xC0");
  EXPECT_TRUE(w.replaced()) << "keys too";
}

}  // namespace
}  // namespace vfio_dra
