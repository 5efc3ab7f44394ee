// The YAML loader (load_string(), load_file()): reads the file, parses the
// document, checks the top level against its allow-list, then runs the
// section parsers (load_sections.h) in order: each walks its section once,
// checking each key against an allow-list and each value's type and range as
// it goes (yaml_value.h), then the rules that span several keys. Every
// refusal names file, line and key path.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <memory>
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

}  // namespace

JobConfig load_string(std::string_view yaml, std::string_view source_name) {
  JobConfig job;
  job.source = std::string(source_name);
  const std::string& source = job.source;

  std::vector<YAML::Node> docs;
  try {
    docs = YAML::LoadAll(std::string(yaml));
  } catch (const YAML::Exception& e) {
    int line = e.mark.is_null() ? 0 : e.mark.line + 1;
    std::string where =
        e.mark.is_null() ? "" : " (column " + std::to_string(e.mark.column + 1) + ")";
    throw ConfigError(source, line, "", "YAML syntax error: " + e.msg + where);
  }
  if (docs.empty() || (docs.size() == 1 && docs[0].IsNull())) {
    throw ConfigError(source, 1, "",
                      "the document is empty (expected a mapping with job and nodes)");
  }
  if (docs.size() > 1) {
    throw ConfigError(source, std::max(line_of(docs[1]), 1), "",
                      "a second YAML document (a job file holds exactly one)");
  }
  Value root_value(&source, docs[0], "", std::max(line_of(docs[0]), 1));
  if (!docs[0].IsMap())
    root_value.fail("expected a mapping at the top, got " + root_value.describe());
  Section root(root_value, {"job", "network", "mempool", "eal", "link", "training", "nodes"});

  detail::parse_job(root, job);
  detail::parse_network(root, job.network);
  detail::parse_mempool(root, job.mempool);
  detail::parse_eal(root, job.eal);
  detail::parse_link(root, job.link);
  detail::parse_training(root, job.training);
  detail::parse_nodes(root, job);
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
