// Helpers shared by the loader's unit tests: a job document built around a
// fixed two-node list whose line numbers are known, an extra worker entry,
// and `refused`, which checks a refusal's file, line, key and message.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "config/config.h"

namespace mercury::config::test {

inline bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

// Two nodes joined by one ring link; with no sections, "nodes:" is line 4,
// the server's "- name" line 5 and the worker's line 11.
inline constexpr std::string_view kNodes =
    "  - name: s0\n"         // 5
    "    role: server\n"     // 6
    "    ipv4: 10.0.0.1\n"   // 7
    "    ports: [ring:a]\n"  // 8
    "    lcores: [0, 1]\n"   // 9
    "    shards: 1\n"        // 10
    "  - name: w0\n"         // 11
    "    role: worker\n"     // 12
    "    ipv4: 10.0.0.2\n"   // 13
    "    ports: [ring:a]\n"  // 14
    "    lcores: [2]\n";     // 15

// The job header takes lines 1-3, so `sections` starts on line 4.
inline std::string doc(std::string_view sections, std::string_view nodes = kNodes) {
  std::string s = "job:\n  id: 7\n  name: demo\n";
  s += sections;
  s += "nodes:\n";
  s += nodes;
  return s;
}

// A worker block of 5 lines, for tests that need more nodes.
inline std::string worker(std::string_view name, std::string_view ip, std::string_view port,
                          std::string_view lcores = "[2]") {
  return "  - name: " + std::string(name) + "\n    role: worker\n    ipv4: " + std::string(ip) +
         "\n    ports: [\"" + std::string(port) + "\"]\n    lcores: " + std::string(lcores) + "\n";
}

// Checks that `yaml` is refused with exactly this file, line and key, and a
// message containing `fragment`; and that what() is "t.yaml:<line>: <key>: ...".
inline ::testing::AssertionResult refused(const std::string& yaml, int line, std::string_view key,
                                          std::string_view fragment) {
  try {
    load_string(yaml, "t.yaml");
  } catch (const ConfigError& e) {
    std::string prefix = "t.yaml:" + std::to_string(line) + ": ";
    if (!key.empty()) prefix += std::string(key) + ": ";
    std::string what = e.what();
    if (e.source() != "t.yaml" || e.line() != line || e.key() != key || !what.starts_with(prefix) ||
        what.find(fragment) == std::string::npos) {
      return ::testing::AssertionFailure()
             << "got: " << what << "\nwant prefix: " << prefix << "\nand fragment: " << fragment;
    }
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "accepted:\n" << yaml;
}

}  // namespace mercury::config::test
