// The loader's view of the YAML document (yaml_value.h): the message text
// helpers, Value's strict typed getters and Section's allow-list check, each
// refusal a ConfigError naming file, line and key.
#include "config/yaml_value.h"

#include <charconv>
#include <cmath>
#include <system_error>

namespace mercury::config::detail {

std::string quoted(std::string_view s) {
  // Long values are cut: the message should point, not repeat the file.
  constexpr size_t kMax = 80;
  // Control characters are escaped so a message stays on one line.
  std::string out = "\"";
  for (char c : s.substr(0, kMax)) {
    if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += '?';
    } else {
      out += c;
    }
  }
  if (s.size() > kMax) out += "...";
  return out + "\"";
}

std::string join(const std::string& parent, std::string_view key) {
  return parent.empty() ? std::string(key) : parent + "." + std::string(key);
}

std::string element(const std::string& parent, size_t i) {
  return parent + "[" + std::to_string(i) + "]";
}

int line_of(const YAML::Node& n) { return n.Mark().is_null() ? 0 : n.Mark().line + 1; }

bool is_name(std::string_view s) {
  if (s.empty() || s.size() > kMaxNameLength) return false;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::string name_rule() {
  return "must match [a-z0-9_-]+ and be at most " + std::to_string(kMaxNameLength) + " characters";
}

// ------------------------------------------------------------------- Value

void Value::fail(const std::string& message) const {
  throw ConfigError(*source_, line_, path_, message);
}

uint64_t Value::integer(uint64_t lo, uint64_t hi) const {
  std::string_view s = plain_scalar("an integer");
  bool negative = !s.empty() && s[0] == '-';
  std::string_view digits = negative ? s.substr(1) : s;
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (digits.empty() || end != digits.data() + digits.size() ||
      (ec != std::errc() && ec != std::errc::result_out_of_range)) {
    fail("expected an integer, got " + describe());
  }
  if (negative || ec == std::errc::result_out_of_range || v < lo || v > hi) {
    fail(std::string(s) + " is out of range (" + std::to_string(lo) + ".." + std::to_string(hi) +
         ")");
  }
  return v;
}

double Value::number() const {
  std::string_view s = plain_scalar("a number");
  double v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v)) {
    fail("expected a number, got " + describe());
  }
  return v;
}

std::optional<bool> Value::boolean_or_auto() const {
  std::string_view s = plain_scalar("true, false or auto");
  if (s == "true") return true;
  if (s == "false") return false;
  if (s == "auto") return std::nullopt;
  fail("expected true, false or auto, got " + describe());
}

bool Value::boolean() const {
  std::string_view s = plain_scalar("true or false");
  if (s == "true") return true;
  if (s == "false") return false;
  fail("expected true or false, got " + describe());
}

std::string Value::string() const {
  if (!node_.IsScalar()) fail("expected a string, got " + describe());
  return node_.Scalar();
}

std::vector<Value> Value::sequence() const {
  if (!node_.IsSequence()) fail("expected a list, got " + describe());
  std::vector<Value> out;
  for (size_t i = 0; i < node_.size(); ++i) {
    YAML::Node item = node_[i];
    int line = line_of(item);
    out.emplace_back(source_, item, element(path_, i), line > 0 ? line : line_);
  }
  return out;
}

std::string Value::describe() const {
  switch (node_.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return "no value";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Scalar:
      break;
  }
  if (node_.Tag() == "?") return quoted(node_.Scalar());
  if (node_.Tag() == "!") return "the quoted string " + quoted(node_.Scalar());
  return quoted(node_.Scalar()) + " tagged " + node_.Tag();
}

std::string_view Value::plain_scalar(const char* expected) const {
  if (!node_.IsScalar() || node_.Tag() != "?") {
    fail(std::string("expected ") + expected + ", got " + describe());
  }
  return node_.Scalar();
}

// ----------------------------------------------------------------- Section

Section::Section(const Value& v, std::initializer_list<std::string_view> allowed)
    : source_(&v.source()), path_(v.path()), line_(v.line()) {
  if (v.node().IsNull()) return;  // "network:" with nothing under it: all defaults
  if (!v.node().IsMap()) v.fail("expected a mapping, got " + v.describe());
  std::string valid;
  for (std::string_view k : allowed) valid += (valid.empty() ? "" : ", ") + std::string(k);
  for (const auto& pair : v.node()) {
    // Copies, not references: yaml-cpp's iterator hands out a temporary pair.
    const YAML::Node key = pair.first;
    const YAML::Node value = pair.second;
    int key_line = line_of(key);
    std::string name =
        key.IsScalar() ? key.Scalar() : "<" + Value(source_, key, "", 0).describe() + ">";
    std::string path = join(path_, name);
    bool known = false;
    for (std::string_view k : allowed) known = known || k == name;
    if (!known) {
      // yaml-cpp 0.7 does not implement merge keys: "<<" arrives as a key.
      std::string hint = name == "<<" ? "; YAML merge keys are not supported" : "";
      throw ConfigError(*source_, key_line, path,
                        "unknown key (valid keys here: " + valid + ")" + hint);
    }
    for (const Entry& e : entries_) {
      if (e.key == name) {
        throw ConfigError(*source_, key_line, path,
                          "key given twice (first on line " + std::to_string(e.key_line) + ")");
      }
    }
    // Point at the key unless the value is a scalar: a null value has no
    // useful position, and a block mapping or list starts on the line
    // after its key, where "nodes: no server" would look misplaced.
    int value_line = value.IsScalar() ? line_of(value) : key_line;
    entries_.push_back(Entry{name, key_line, Value(source_, value, path, value_line)});
  }
}

std::optional<Value> Section::get(std::string_view key) const {
  for (const Entry& e : entries_) {
    if (e.key == key) return e.value;
  }
  return std::nullopt;
}

Value Section::require(std::string_view key) const {
  if (auto v = get(key)) return *v;
  throw ConfigError(*source_, line_, join(path_, key), "required key is missing");
}

Section optional_section(const Section& parent, std::string_view key,
                         std::initializer_list<std::string_view> allowed) {
  if (auto v = parent.get(key)) return Section(*v, allowed);
  return Section(Value(&parent.source(), YAML::Node(), join(parent.path(), key), parent.line()),
                 allowed);
}

double half_open(const Value& v, double lo, double hi) {
  double x = v.number();
  if (!(x >= lo && x < hi)) {
    v.fail(v.text() + " is out of range [" + std::to_string(static_cast<int>(lo)) + ", " +
           std::to_string(static_cast<int>(hi)) + ")");
  }
  return x;
}

double positive(const Value& v) {
  double x = v.number();
  if (!(x > 0)) v.fail(v.text() + " is out of range (must be > 0)");
  return x;
}

}  // namespace mercury::config::detail
