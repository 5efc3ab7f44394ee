#include "trace.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace mercury::trace {
namespace {

// A model of four tensors in three layers; line 1 is a comment, so the
// tensors are on lines 2, 3, 5 and 6.
constexpr std::string_view kModel =
    "# tiny model\n"
    "a.weight 6 2x3\n"
    "a.bias 2 2\n"
    "\n"
    "b.weight 4 4  # a comment\n"
    "c.weight 3 3\n";

std::vector<agg::TensorDecl> decls() { return agg::parse_model_shapes(kModel); }

Trace parse(std::string_view trace) {
  return parse_trace({"t.txt", trace}, {"m.txt", kModel}, decls());
}

// The message of the exception parse() throws (empty if none).
std::string refusal(std::string_view trace) {
  try {
    parse(trace);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(Trace, ParsesLayersAgainstTheModel) {
  const Trace t = parse(
      "# header\n"
      "a 10.5 20 a.weight a.bias\n"
      "\n"
      "  b\t0 1e3 b.weight   # trailing comment\n"
      "c 2.25 0.75 c.weight\r\n");
  EXPECT_EQ(t.source, "t.txt");
  ASSERT_EQ(t.layers.size(), 3u);
  EXPECT_EQ(t.layers[0].name, "a");
  EXPECT_DOUBLE_EQ(t.layers[0].forward_us, 10.5);
  EXPECT_DOUBLE_EQ(t.layers[0].backward_us, 20);
  EXPECT_EQ(t.layers[0].first_tensor, 0u);
  EXPECT_EQ(t.layers[0].tensors, 2u);
  EXPECT_EQ(t.layers[0].line, 2u);
  EXPECT_EQ(t.layers[1].name, "b");
  EXPECT_DOUBLE_EQ(t.layers[1].backward_us, 1000);
  EXPECT_EQ(t.layers[1].first_tensor, 2u);
  EXPECT_EQ(t.layers[1].tensors, 1u);
  EXPECT_EQ(t.layers[1].line, 4u);
  EXPECT_EQ(t.layers[2].first_tensor, 3u);
  EXPECT_DOUBLE_EQ(t.compute_us(), 10.5 + 20 + 0 + 1000 + 2.25 + 0.75);
}

TEST(Trace, RefusesBadLinesNamingFileAndLine) {
  const std::string good_tail = "b 1 1 b.weight\nc 1 1 c.weight\n";
  struct Case {
    std::string trace;
    std::string message;
  };
  const Case cases[] = {
      {"a 1 1\n" + good_tail,
       "t.txt:1: expected '<layer> <forward_us> <backward_us> <tensor>...', got 'a 1 1'"},
      {"# x\na\n", "t.txt:2: expected '<layer> <forward_us> <backward_us> <tensor>...', got 'a'"},
      {"a abc 1 a.weight a.bias\n" + good_tail,
       "t.txt:1: forward_us 'abc' is not a number of microseconds from 0 to 1e9"},
      {"a 12x 1 a.weight a.bias\n" + good_tail, "t.txt:1: forward_us '12x'"},
      {"a 1 -1 a.weight a.bias\n" + good_tail, "t.txt:1: backward_us '-1'"},
      {"a 1 inf a.weight a.bias\n" + good_tail, "t.txt:1: backward_us 'inf'"},
      {"a nan 1 a.weight a.bias\n" + good_tail, "t.txt:1: forward_us 'nan'"},
      {"a 1 2e9 a.weight a.bias\n" + good_tail, "t.txt:1: backward_us '2e9'"},
      {"a 1 1 a.weight a.bias\nb 1 1 b.weight\nb 1 1 c.weight\n",
       "t.txt:3: layer 'b' again (first at line 2)"},
      // A tensor out of order: the model's line of both is named.
      {"a 1 1 a.weight b.weight\n" + good_tail,
       "t.txt:1: tensor 'b.weight' is not the model's next, 'a.bias' at m.txt:3 (it is at "
       "m.txt:5): a layer's tensors are the model file's next lines"},
      {"a 1 1 a.weight a.bias\nc 1 1 c.weight\n",
       "t.txt:2: tensor 'c.weight' is not the model's next, 'b.weight' at m.txt:5 (it is at "
       "m.txt:6)"},
      {"a 1 1 a.weight a.bias\n\nb 1 1 b.weight\nc 1 1 conv.weight\n",
       "t.txt:4: tensor 'conv.weight' is not the model's next, 'c.weight' at m.txt:6: a layer's"},
      {"a 1 1 a.weight a.bias\nb 1 1 b.weight\nc 1 1 c.weight\nd 1 1 d.weight\n",
       "t.txt:4: tensor 'd.weight' is past the end of m.txt (4 tensors)"},
      {"a 1 1 a.weight a.bias\nb 1 1 b.weight c.weight c.weight\n",
       "t.txt:2: tensor 'c.weight' is past the end of m.txt (4 tensors)"},
      // What only the end shows: the file, no line.
      {"a 1 1 a.weight a.bias\nb 1 1 b.weight\n",
       "t.txt: the layers cover 3 of 4 tensors of m.txt; m.txt:6 'c.weight' is in no layer"},
      {"# only comments\n\n", "t.txt: no layers"},
      {"", "t.txt: no layers"},
  };
  for (const Case& c : cases) {
    const std::string got = refusal(c.trace);
    EXPECT_NE(got.find(c.message), std::string::npos)
        << "trace:\n"
        << c.trace << "wanted: " << c.message << "\ngot:    " << got;
  }
}

TEST(Trace, RefusesDeclarationsThatAreNotTheModelText) {
  std::vector<agg::TensorDecl> d = decls();
  d.pop_back();
  EXPECT_THROW(parse_trace({"t.txt", "a 1 1 a.weight\n"}, {"m.txt", kModel}, d), std::logic_error);
}

std::string read(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Every committed trace matches its model file, and the five models the
// evaluation needs have one.
TEST(Trace, CommittedTracesMatchTheirModels) {
  const std::filesystem::path dir = std::filesystem::path(MERCURY_CONFIG_DIR);
  for (const char* model : {"resnet50", "vgg16", "alexnet", "inception_v3", "mobilenet_v2"}) {
    EXPECT_TRUE(std::filesystem::exists(dir / "traces" / (std::string(model) + ".txt"))) << model;
  }
  int checked = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir / "traces")) {
    if (e.path().extension() != ".txt") continue;
    const std::filesystem::path model = dir / "models" / e.path().filename();
    SCOPED_TRACE(e.path().string());
    const std::string trace_text = read(e.path());
    const std::string model_text = read(model);
    const std::string trace_path = e.path().string(), model_path = model.string();
    const Trace t = parse_trace({trace_path, trace_text}, {model_path, model_text},
                                agg::parse_model_shapes(model_text));
    EXPECT_GT(t.compute_us(), 0);
    ++checked;
  }
  EXPECT_GE(checked, 5);
}

}  // namespace
}  // namespace mercury::trace
