#include "base/json_writer.h"

#include <cassert>

namespace vfio_dra {
namespace {

bool Continuation(std::string_view s, size_t at) {
  return at < s.size() && (static_cast<unsigned char>(s[at]) & 0xC0) == 0x80;
}

// The length of the UTF-8 sequence that starts at `at` (its first byte is 0x80 or above), or 0
// when it is not one: RFC 3629's table, so no overlong forms, surrogates or code points past
// U+10FFFF.
size_t Utf8SequenceLength(std::string_view s, size_t at) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[at + i]); };
  const unsigned char lead = byte(0);
  size_t length = 0;
  unsigned char low = 0x80;  // the bounds of the second byte, which the lead narrows
  unsigned char high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return 0;
  }
  if (at + length > s.size() || byte(1) < low || byte(1) > high) return 0;
  for (size_t i = 2; i < length; ++i) {
    if (!Continuation(s, at + i)) return 0;
  }
  return length;
}

}  // namespace

bool AppendJsonString(std::string& out, std::string_view value) {
  bool faithful = true;
  static constexpr char kHex[] = "0123456789abcdef";
  out.push_back('"');
  size_t run = 0;  // the start of the bytes that go out as they are
  for (size_t i = 0; i < value.size();) {
    const auto c = static_cast<unsigned char>(value[i]);
    if (c >= 0x20 && c != '"' && c != '\\' && c < 0x80) {
      ++i;
      continue;
    }
    if (c >= 0x80) {
      if (const size_t length = Utf8SequenceLength(value, i); length != 0) {
        i += length;
        continue;
      }
    }
    out.append(value.substr(run, i - run));
    switch (c) {
      case '"':
        out.append("\\\"");
        break;
      case '\\':
        out.append("\\\\");
        break;
      case '\n':
        out.append("\\n");
        break;
      case '\t':
        out.append("\\t");
        break;
      case '\r':
        out.append("\\r");
        break;
      case '\b':
        out.append("\\b");
        break;
      case '\f':
        out.append("\\f");
        break;
      default:
        if (c < 0x20) {
          out.append("\\u00").push_back(kHex[c >> 4]);
          out.push_back(kHex[c & 0xF]);
        } else {
          out.append("\xEF\xBF\xBD");  // not UTF-8: U+FFFD REPLACEMENT CHARACTER
          faithful = false;
        }
    }
    run = ++i;
  }
  out.append(value.substr(run));
  out.push_back('"');
  return faithful;
}

void JsonWriter::NewLine() {
  if (indent_ < 0) return;
  out_.push_back('\n');
  out_.append(levels_.size() * static_cast<size_t>(indent_), ' ');
}

void JsonWriter::BeforeValue() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  assert(levels_.empty() || !levels_.back().object);  // a member needs its Key first
  if (levels_.empty()) return;
  if (!levels_.back().empty) out_.push_back(',');
  levels_.back().empty = false;
  NewLine();
}

void JsonWriter::Key(std::string_view key) {
  assert(!levels_.empty() && levels_.back().object && !after_key_);
  if (!levels_.back().empty) out_.push_back(',');
  levels_.back().empty = false;
  NewLine();
  if (!AppendJsonString(out_, key)) replaced_ = true;
  out_.append(indent_ < 0 ? ":" : ": ");
  after_key_ = true;
}

void JsonWriter::Open(char bracket, bool object) {
  BeforeValue();
  out_.push_back(bracket);
  levels_.push_back({object, true});
}

void JsonWriter::Close(char bracket) {
  assert(!levels_.empty() && levels_.back().object == (bracket == '}') && !after_key_);
  const bool empty = levels_.back().empty;
  levels_.pop_back();
  if (!empty) NewLine();
  out_.push_back(bracket);
}

void JsonWriter::String(std::string_view value) {
  BeforeValue();
  if (!AppendJsonString(out_, value)) replaced_ = true;
}

void JsonWriter::Int(int64_t value) {
  BeforeValue();
  out_.append(std::to_string(value));
}

void JsonWriter::Bool(bool value) {
  BeforeValue();
  out_.append(value ? "true" : "false");
}

void JsonWriter::Value(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::object:
      BeginObject();
      for (const auto& [key, member] : value.items()) {
        Key(key);
        Value(member);
      }
      EndObject();
      return;
    case nlohmann::json::value_t::array:
      BeginArray();
      for (const nlohmann::json& element : value) Value(element);
      EndArray();
      return;
    case nlohmann::json::value_t::string:
      String(value.get_ref<const std::string&>());
      return;
    case nlohmann::json::value_t::boolean:
      Bool(value.get<bool>());
      return;
    case nlohmann::json::value_t::number_integer:
      Int(value.get<int64_t>());
      return;
    default:
      // null, unsigned and floating-point numbers, binary: as nlohmann::json writes them.
      BeforeValue();
      out_.append(value.dump());
  }
}

void JsonWriter::StringArray(const std::vector<std::string>& values) {
  BeginArray();
  for (const std::string& value : values) String(value);
  EndArray();
}

std::string JsonWriter::Take() {
  std::string text = std::move(out_);
  out_.clear();
  levels_.clear();
  after_key_ = false;
  replaced_ = false;
  return text;
}

}  // namespace vfio_dra
