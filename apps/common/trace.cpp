#include "trace.h"

#include <charconv>
#include <cmath>
#include <map>
#include <stdexcept>
#include <string>

namespace mercury::trace {

namespace {

constexpr double kMaxMicroseconds = 1e9;  // 1000 s of compute for one layer

// The line's words, after '#' comments are cut off.
std::vector<std::string_view> words_of(std::string_view line) {
  if (const size_t hash = line.find('#'); hash != std::string_view::npos) {
    line = line.substr(0, hash);
  }
  std::vector<std::string_view> words;
  for (size_t i = 0;;) {
    const size_t b = line.find_first_not_of(" \t\r", i);
    if (b == std::string_view::npos) break;
    const size_t e = std::min(line.find_first_of(" \t\r", b), line.size());
    words.push_back(line.substr(b, e - b));
    i = e;
  }
  return words;
}

// Calls `fn(line number, words)` for every line of `text` that has words.
template <class Fn>
void for_each_line(std::string_view text, Fn fn) {
  uint32_t line_no = 0;
  while (!text.empty()) {
    ++line_no;
    const size_t nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    const std::vector<std::string_view> words = words_of(line);
    if (!words.empty()) fn(line_no, words);
  }
}

// (Appended, not "'" + std::string(s): GCC 12 warns, wrongly, of an
// overlapping copy in that form, -Wrestrict.)
std::string quoted(std::string_view s) {
  std::string q = "'";
  q.append(s);
  q.push_back('\'');
  return q;
}

}  // namespace

double Trace::compute_us() const {
  double sum = 0;
  for (const Layer& l : layers) sum += l.forward_us + l.backward_us;
  return sum;
}

Trace parse_trace(Text trace, Text model, const std::vector<agg::TensorDecl>& decls) {
  // The model file's line of each tensor, by the rule parse_model_shapes
  // reads it with (the first word of each line that has one).
  std::vector<uint32_t> model_line;
  for_each_line(model.contents,
                [&](uint32_t n, const std::vector<std::string_view>&) { model_line.push_back(n); });
  if (model_line.size() != decls.size()) {
    throw std::logic_error(std::string(model.path) + " has " + std::to_string(model_line.size()) +
                           " tensor lines but " + std::to_string(decls.size()) +
                           " declarations were given");
  }
  auto model_at = [&](size_t k) {
    return std::string(model.path) + ":" + std::to_string(model_line[k]);
  };

  Trace t;
  t.source = std::string(trace.path);
  std::map<std::string, uint32_t, std::less<>> seen;  // layer name -> its line
  uint32_t next = 0;                                  // the model's next tensor
  for_each_line(trace.contents, [&](uint32_t n, const std::vector<std::string_view>& w) {
    const std::string at = std::string(trace.path) + ":" + std::to_string(n) + ": ";
    if (w.size() < 4) {
      std::string got;
      for (std::string_view x : w) {
        if (!got.empty()) got.push_back(' ');
        got.append(x);
      }
      throw std::invalid_argument(
          at + "expected '<layer> <forward_us> <backward_us> <tensor>...', got '" + got + "'");
    }
    auto microseconds = [&](std::string_view word, const char* what) {
      double v = 0;
      const auto [ptr, ec] = std::from_chars(word.data(), word.data() + word.size(), v);
      if (ec != std::errc{} || ptr != word.data() + word.size() || !std::isfinite(v) || v < 0 ||
          v > kMaxMicroseconds) {
        throw std::invalid_argument(at + what + " " + quoted(word) +
                                    " is not a number of microseconds from 0 to 1e9");
      }
      return v;
    };
    Layer l;
    l.name = std::string(w[0]);
    l.forward_us = microseconds(w[1], "forward_us");
    l.backward_us = microseconds(w[2], "backward_us");
    l.first_tensor = next;
    l.line = n;
    if (const auto [it, fresh] = seen.emplace(l.name, n); !fresh) {
      throw std::invalid_argument(at + "layer " + quoted(l.name) + " again (first at line " +
                                  std::to_string(it->second) + ")");
    }
    for (size_t i = 3; i < w.size(); ++i, ++next) {
      if (next == decls.size()) {
        throw std::invalid_argument(at + "tensor " + quoted(w[i]) + " is past the end of " +
                                    std::string(model.path) + " (" + std::to_string(decls.size()) +
                                    " tensors)");
      }
      if (w[i] != decls[next].name) {
        std::string where;
        for (size_t k = 0; k < decls.size(); ++k) {
          if (decls[k].name == w[i]) where = " (it is at " + model_at(k) + ")";
        }
        throw std::invalid_argument(at + "tensor " + quoted(w[i]) + " is not the model's next, " +
                                    quoted(decls[next].name) + " at " + model_at(next) + where +
                                    ": a layer's tensors are the model file's next lines");
      }
    }
    l.tensors = next - l.first_tensor;
    t.layers.push_back(std::move(l));
  });
  if (t.layers.empty()) {
    throw std::invalid_argument(t.source +
                                ": no layers (expected '<layer> <forward_us> "
                                "<backward_us> <tensor>...' lines)");
  }
  if (next != decls.size()) {
    throw std::invalid_argument(t.source + ": the layers cover " + std::to_string(next) + " of " +
                                std::to_string(decls.size()) + " tensors of " +
                                std::string(model.path) + "; " + model_at(next) + " " +
                                quoted(decls[next].name) + " is in no layer");
  }
  return t;
}

}  // namespace mercury::trace
