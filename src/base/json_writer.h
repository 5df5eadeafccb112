// JsonWriter: writes JSON text as it goes, without building a document first. For the files
// written on every prepare (the claim's checkpoint record, twice; its CDI specs; KubeVirt's
// metadata file), where nlohmann::json's tree, a map node and a string per member, made and freed
// for one dump, cost as much as the writing itself. Reading stays with nlohmann::json.
// Invariants:
// - The text is always valid UTF-8 JSON once every Begin has its End: strings are escaped as
//   RFC 8259 requires (quote, backslash, control characters), and a byte sequence that is not
//   UTF-8 is written as U+FFFD (nlohmann::json's parser, which reads these files back, rejects
//   invalid UTF-8, and a record that cannot be parsed is lost to its claim); replaced() says so,
//   for a caller that must not record a value other than the one it was given.
// - Members come out in the order written (a reader must not depend on the order).
// - Misuse (a value without a key in an object, an End that does not match) is a programming
//   error, caught by assertions in debug builds.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace vfio_dra {

class JsonWriter {
 public:
  // `indent`: spaces per level, one member or element per line, as nlohmann::json's dump(indent)
  // lays it out; negative: all on one line.
  explicit JsonWriter(int indent = -1) : indent_(indent) {
    levels_.reserve(8);
    out_.reserve(1024);  // a record or a spec; grown like any string past it
  }

  void BeginObject() { Open('{', true); }
  void EndObject() { Close('}'); }
  void BeginArray() { Open('[', false); }
  void EndArray() { Close(']'); }
  // The name of the next member; inside an object, before each value.
  void Key(std::string_view key);
  void String(std::string_view value);
  void Int(int64_t value);
  void Bool(bool value);
  // A member of the object being written: Key, then the value.
  void StringMember(std::string_view key, std::string_view value) {
    Key(key);
    String(value);
  }
  void IntMember(std::string_view key, int64_t value) {
    Key(key);
    Int(value);
  }
  void BoolMember(std::string_view key, bool value) {
    Key(key);
    Bool(value);
  }
  // A document read with nlohmann::json (a published attribute, say), written back as it is.
  void Value(const nlohmann::json& value);
  void StringArray(const std::vector<std::string>& values);

  // Whether a string written so far held bytes that are not UTF-8 (written as U+FFFD).
  bool replaced() const { return replaced_; }
  // The text written so far; the writer is empty afterwards.
  std::string Take();

 private:
  struct Level {
    bool object = false;
    bool empty = true;
  };
  // Separates a value from the one before it and, in an object, follows its Key.
  void BeforeValue();
  void Open(char bracket, bool object);
  void Close(char bracket);
  void NewLine();

  int indent_;
  std::vector<Level> levels_;
  bool after_key_ = false;
  bool replaced_ = false;
  std::string out_;
};

// Appends `value` to `out` as a JSON string, quotes included (see JsonWriter for the rules).
// Returns false when bytes that are not UTF-8 were written as U+FFFD.
bool AppendJsonString(std::string& out, std::string_view value);

}  // namespace vfio_dra
