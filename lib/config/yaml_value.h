// Internal to lib/config (not installed): the loader's view of the YAML
// document. A Value is one node with the file, line and key path it came
// from, read through strict typed getters; a Section is a mapping whose keys
// were checked against an allow-list. Every refusal is a ConfigError naming
// file, line and key (Value::fail). The per-section parsers (load_sections.h)
// are written in these terms only.
//
// yaml-cpp's own conversions are avoided on purpose: as<bool>() takes "yes"
// and "on", as<int>() takes "0x10" and quoted numbers. Scalars are read as
// text and parsed strictly here, so a file means one thing.
//
// Control path only: everything here allocates and throws. Reentrant.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "config/config.h"

namespace mercury::config::detail {

inline constexpr size_t kMaxNameLength = 32;
inline constexpr uint64_t kU32Max = std::numeric_limits<uint32_t>::max();
inline constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();

/// `s` in double quotes for a message: cut after 80 characters, control
/// characters escaped so the message stays on one line.
std::string quoted(std::string_view s);
/// The key path of `key` under `parent` ("network" + "mtu" -> "network.mtu").
std::string join(const std::string& parent, std::string_view key);
/// The key path of item i of the list at `parent` ("nodes" -> "nodes[1]").
std::string element(const std::string& parent, size_t i);
/// 1-based line of n, 0 if yaml-cpp has no position for it.
int line_of(const YAML::Node& n);
/// A job, node or ring link name: [a-z0-9_-]+, at most kMaxNameLength.
bool is_name(std::string_view s);
/// The rule is_name() checks, for messages.
std::string name_rule();

// One value of the document and where it came from.
class Value {
 public:
  Value() = default;
  Value(const std::string* source, YAML::Node node, std::string path, int line)
      : source_(source), node_(std::move(node)), path_(std::move(path)), line_(line) {}

  const YAML::Node& node() const { return node_; }
  const std::string& path() const { return path_; }
  int line() const { return line_; }
  const std::string& source() const { return *source_; }
  /// The scalar as written (empty for non-scalars); for messages.
  std::string text() const { return node_.IsScalar() ? node_.Scalar() : std::string(); }

  /// Throws ConfigError(source, line, path, message).
  [[noreturn]] void fail(const std::string& message) const;

  /// A plain decimal integer in lo..hi.
  uint64_t integer(uint64_t lo, uint64_t hi) const;
  /// A finite number; the caller checks the range (ranges differ in shape).
  double number() const;
  /// `true` or `false`, or `auto` (nullopt), nothing else.
  std::optional<bool> boolean_or_auto() const;
  /// `true` or `false`, nothing else.
  bool boolean() const;
  /// Any scalar, quoted or not.
  std::string string() const;
  /// The option whose name the string is.
  template <typename E>
  E choice(std::initializer_list<std::pair<std::string_view, E>> options) const {
    std::string s = string();
    std::string names;
    for (const auto& [name, value] : options) {
      if (s == name) return value;
      names += (names.empty() ? "" : ", ") + std::string(name);
    }
    fail(quoted(s) + " is not one of " + names);
  }
  /// The items of a list, each with its own path (path[i]) and line.
  std::vector<Value> sequence() const;
  /// What the value is, for "expected ..., got ..." messages.
  std::string describe() const;

 private:
  // Numbers and booleans must be plain scalars: a quoted "1500" is a string,
  // and accepting it would hide a mistake in a generated file.
  std::string_view plain_scalar(const char* expected) const;

  const std::string* source_ = nullptr;
  YAML::Node node_;
  std::string path_;
  int line_ = 0;
};

// A mapping whose keys have been checked against an allow-list.
class Section {
 public:
  /// Refuses a non-mapping, an unknown key (listing the valid ones) and a key
  /// given twice. A null value ("network:" with nothing under it) is an
  /// empty section: all defaults.
  Section(const Value& v, std::initializer_list<std::string_view> allowed);

  std::optional<Value> get(std::string_view key) const;
  /// Refuses a missing key on the section's own line.
  Value require(std::string_view key) const;

  int line() const { return line_; }
  const std::string& path() const { return path_; }
  const std::string& source() const { return *source_; }

 private:
  struct Entry {
    std::string key;
    int key_line;
    Value value;
  };
  const std::string* source_;
  std::string path_;
  int line_;
  std::vector<Entry> entries_;
};

/// parent[key] as a section, or an empty one (all defaults) if absent.
Section optional_section(const Section& parent, std::string_view key,
                         std::initializer_list<std::string_view> allowed);
/// A probability or similar: lo <= v < hi.
double half_open(const Value& v, double lo, double hi);
/// A number > 0.
double positive(const Value& v);

}  // namespace mercury::config::detail
