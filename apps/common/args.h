// The command line of every Mercury app, parsed one way: options are declared
// once, with their help text, and the parser gives every app the same
// --help, the same errors ("--rounds wants a whole number 1..4294967295, not
// 'x'"), and the same "--" that ends the app's arguments (what follows goes
// to EAL).
//
//   apps::Args args("ps-worker", "--config FILE --node NAME [options] [-- EAL args...]");
//   args.text("--config", "FILE", &o.config, "the job file", apps::Args::kRequired);
//   args.whole("--rounds", "N", &o.rounds, 1, UINT32_MAX, "push_pull rounds (default 10)");
//   args.flag("--check", &o.check, "validate the job file and exit");
//   args.rest(&o.eal, "extra EAL arguments");
//   args.parse(argc, argv);   // --help prints the usage and exits 0
//
// Control path, header only. parse() throws std::runtime_error with a
// message meant for the operator; mains print it and exit 1.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace mercury::apps {

class Args {
 public:
  static constexpr bool kRequired = true;

  Args(std::string program, std::string synopsis)
      : program_(std::move(program)), synopsis_(std::move(synopsis)) {}

  /// A string option ("--config FILE").
  void text(std::string name, std::string metavar, std::string* out, std::string help,
            bool required = false) {
    add(std::move(name), std::move(metavar), std::move(help), required,
        [out](const std::string&, const std::string& v) { *out = v; });
  }

  /// A whole number in [min, max] ("--rounds N").
  template <class T>
  void whole(std::string name, std::string metavar, T* out, uint64_t min, uint64_t max,
             std::string help) {
    add(name, std::move(metavar), std::move(help), false,
        [out, min, max](const std::string& n, const std::string& v) {
          char* end = nullptr;
          errno = 0;
          const unsigned long long x = std::strtoull(v.c_str(), &end, 10);
          if (v.empty() || v[0] == '-' || *end != '\0' || errno != 0 || x < min || x > max) {
            throw std::runtime_error(n + " wants a whole number " + std::to_string(min) + ".." +
                                     std::to_string(max) + ", not '" + v + "'");
          }
          *out = static_cast<T>(x);
        });
  }

  /// A number > 0 ("--seconds N").
  void positive(std::string name, std::string metavar, double* out, std::string help) {
    add(name, std::move(metavar), std::move(help), false,
        [out](const std::string& n, const std::string& v) {
          char* end = nullptr;
          const double x = std::strtod(v.c_str(), &end);
          if (v.empty() || *end != '\0' || !(x > 0) || x > 1e12) {
            throw std::runtime_error(n + " wants a positive number, not '" + v + "'");
          }
          *out = x;
        });
  }

  /// A switch without a value ("--check").
  void flag(std::string name, bool* out, std::string help) {
    options_.push_back({std::move(name), "", std::move(help), false, false,
                        [out](const std::string&, const std::string&) { *out = true; }});
  }

  /// What follows "--" (EAL arguments); without rest(), "--" is refused.
  void rest(std::vector<std::string>* out, std::string help) {
    rest_ = out;
    rest_help_ = std::move(help);
  }

  /// Parses argv; --help / -h prints usage() and exits 0. Throws
  /// std::runtime_error for an unknown option, a missing or bad value, or a
  /// required option not given.
  void parse(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        std::fputs(usage().c_str(), stdout);
        std::exit(0);
      }
      if (a == "--" && rest_ != nullptr) {
        for (++i; i < argc; ++i) rest_->emplace_back(argv[i]);
        break;
      }
      Option* o = find(a);
      if (o == nullptr) throw std::runtime_error("unknown argument " + a + " (see --help)");
      std::string value;
      if (o->takes_value) {
        if (i + 1 >= argc) throw std::runtime_error(a + " needs a value (" + o->metavar + ")");
        value = argv[++i];
      }
      o->apply(a, value);
      o->seen = true;
    }
    for (const Option& o : options_) {
      if (o.required && !o.seen) {
        throw std::runtime_error(o.name + " " + o.metavar + " is required (see --help)");
      }
    }
  }

  [[nodiscard]] std::string usage() const {
    std::string u = "usage: " + program_ + " " + synopsis_ + "\n";
    for (const Option& o : options_) {
      std::string left = "  " + o.name + (o.metavar.empty() ? "" : " " + o.metavar);
      if (left.size() < 20) left.resize(20, ' ');
      u += left + " " + o.help + "\n";
    }
    if (rest_ != nullptr) u += "  -- ARGS             " + rest_help_ + "\n";
    return u;
  }

 private:
  struct Option {
    std::string name;
    std::string metavar;
    std::string help;
    bool required = false;
    bool takes_value = true;
    std::function<void(const std::string&, const std::string&)> apply;
    bool seen = false;
  };

  void add(std::string name, std::string metavar, std::string help, bool required,
           std::function<void(const std::string&, const std::string&)> apply) {
    options_.push_back(
        {std::move(name), std::move(metavar), std::move(help), required, true, std::move(apply)});
  }
  Option* find(const std::string& name) {
    for (Option& o : options_) {
      if (o.name == name) return &o;
    }
    return nullptr;
  }

  std::string program_;
  std::string synopsis_;
  std::vector<Option> options_;
  std::vector<std::string>* rest_ = nullptr;
  std::string rest_help_;
};

}  // namespace mercury::apps
