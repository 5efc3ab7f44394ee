// The YAML loader (load_string(), load_file()): reads the file, parses the
// document, checks the top level against its allow-list, then runs the
// section parsers (load_sections.h) in order: each walks its section once,
// checking each key against an allow-list and each value's type and range as
// it goes (yaml_value.h), then the rules that span several keys. Every
// refusal names file, line and key path.
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <memory>
#include <sstream>
#include <system_error>
#include <vector>

#include "config/config.h"
#include "config/load_sections.h"

namespace mercury::config {

using detail::line_of;
using detail::Section;
using detail::Value;

namespace {

std::string error_text(int err) { return std::error_code(err, std::generic_category()).message(); }

// Where each YAML document of the stream starts, and its first node's line
// (what a refusal of the document names); nothing else is kept.
class DocumentStarts final : public YAML::EventHandler {
 public:
  std::vector<YAML::Mark> starts;
  std::vector<int> first_lines;  // 1-based; 0 while the document has no node yet
  void OnDocumentStart(const YAML::Mark& mark) override {
    starts.push_back(mark);
    first_lines.push_back(0);
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& m, YAML::anchor_t) override { node(m); }
  void OnAlias(const YAML::Mark& m, YAML::anchor_t) override { node(m); }
  void OnScalar(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                const std::string&) override {
    node(m);
  }
  void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    node(m);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    node(m);
  }
  void OnMapEnd() override {}

 private:
  void node(const YAML::Mark& m) {
    if (!first_lines.empty() && first_lines.back() == 0) first_lines.back() = m.line + 1;
  }
};

// The stream's first document, how many there are (counting stops at two: a
// job file holds one) and the line where the second starts. Not
// YAML::LoadAll: yaml-cpp 0.7 never finishes on a stray ',' outside a flow
// collection (",", "a: 1\n,"): it returns empty document after empty
// document from the same place, filling memory. A document that starts
// where the previous one started is that case, refused here.
struct Documents {
  YAML::Node first;
  size_t count = 0;
  int second_line = 0;
};

Documents load_documents(const std::string& yaml, const std::string& source) {
  std::istringstream in(yaml);
  YAML::Parser parser(in);
  DocumentStarts seen;
  while (seen.starts.size() < 2 && parser.HandleNextDocument(seen)) {
    const size_t n = seen.starts.size();
    if (n >= 2 && seen.starts[n - 1].pos == seen.starts[n - 2].pos) {
      const YAML::Mark& m = seen.starts[n - 1];
      const auto at = static_cast<size_t>(std::max(m.pos, 0));
      const std::string what = at < yaml.size() ? "'" + std::string(1, yaml[at]) + "'" : "the end";
      throw ConfigError(source, m.line + 1, "",
                        "YAML syntax error: unexpected " + what + " (column " +
                            std::to_string(m.column + 1) +
                            "; a ',' belongs inside [ ] or { }, or in quotes)");
    }
  }
  Documents d;
  d.count = seen.starts.size();
  if (d.count > 0) d.first = YAML::Load(yaml);
  if (d.count > 1) {
    d.second_line = seen.first_lines[1] != 0 ? seen.first_lines[1] : seen.starts[1].line + 1;
  }
  return d;
}

}  // namespace

JobConfig load_string(std::string_view yaml, std::string_view source_name) {
  JobConfig job;
  job.source = std::string(source_name);
  const std::string& source = job.source;

  Documents docs;
  try {
    docs = load_documents(std::string(yaml), source);
  } catch (const YAML::Exception& e) {
    int line = e.mark.is_null() ? 0 : e.mark.line + 1;
    std::string where =
        e.mark.is_null() ? "" : " (column " + std::to_string(e.mark.column + 1) + ")";
    throw ConfigError(source, line, "", "YAML syntax error: " + e.msg + where);
  }
  if (docs.count > 1) {
    throw ConfigError(source, std::max(docs.second_line, 1), "",
                      "a second YAML document (a job file holds exactly one)");
  }
  if (docs.count == 0 || docs.first.IsNull()) {
    throw ConfigError(source, 1, "",
                      "the document is empty (expected a mapping with job and nodes)");
  }
  const YAML::Node& root_node = docs.first;
  Value root_value(&source, root_node, "", std::max(line_of(root_node), 1));
  if (!root_node.IsMap())
    root_value.fail("expected a mapping at the top, got " + root_value.describe());
  Section root(root_value,
               {"job", "network", "mempool", "eal", "link", "training", "checkpoint", "nodes"});

  detail::parse_job(root, job);
  detail::parse_network(root, job.network);
  detail::parse_mempool(root, job.mempool);
  detail::parse_eal(root, job.eal);
  detail::parse_link(root, job.link);
  detail::parse_training(root, job.training);
  detail::parse_nodes(root, job);
  detail::parse_checkpoint(root, job);
  detail::parse_server_loss(root, job);
  detail::check_worker_loss(root, job);
  return job;
}

JobConfig load_file(const std::string& path) {
  struct Closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, Closer> file(std::fopen(path.c_str(), "rb"));
  if (!file) throw ConfigError(path, "cannot open: " + error_text(errno));
  std::string text;
  char buf[16384];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, file.get())) > 0) text.append(buf, n);
  if (std::ferror(file.get())) throw ConfigError(path, "cannot read: " + error_text(errno));
  return load_string(text, path);
}

}  // namespace mercury::config
