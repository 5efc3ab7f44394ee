// Refusals of the file and the document (cannot open, YAML syntax, empty,
// two documents, not a mapping) and of keys and values anywhere in it
// (unknown or repeated key, missing key, wrong type, out of range, not one of
// the choices), each with its file, line and key.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "config/load_test_util.h"

namespace mercury::config {
namespace {

using test::doc;
using test::kNodes;
using test::refused;

TEST(ConfigRefuse, FileThatCannotBeOpenedNamesPathAndStrerror) {
  try {
    load_file("/nonexistent/job.yaml");
    FAIL() << "no throw";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "/nonexistent/job.yaml: cannot open: No such file or directory");
  }
}

TEST(ConfigRefuse, ErrorsFromAFileNameThePath) {
  // The process id in the name: builds of other checkouts may run this test at once.
  auto path = std::filesystem::temp_directory_path() /
              ("mercury_config_test_bad_" + std::to_string(::getpid()) + ".yaml");
  {
    std::ofstream out(path);
    out << doc("network:\n  mtu: 100\n");
  }
  try {
    load_file(path.string());
    FAIL() << "no throw";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              path.string() + ":5: network.mtu: 100 is out of range (576..9000)");
  }
  std::filesystem::remove(path);
}

TEST(ConfigRefuse, YamlSyntaxErrorNamesLine) {
  EXPECT_TRUE(refused("job:\n  id: 7\n  name: [demo\nnodes: []\n", 4, "", "YAML syntax error"));
}

// yaml-cpp 0.7's LoadAll never returns on these (empty documents without
// end, memory growing): refused at once, with the line.
TEST(ConfigRefuse, AStrayCommaIsASyntaxErrorNotAHang) {
  EXPECT_TRUE(refused(",", 1, "", "YAML syntax error: unexpected ',' (column 1"));
  EXPECT_TRUE(refused(",,\n", 1, "", "YAML syntax error: unexpected ','"));
  EXPECT_TRUE(refused(doc("") + ",\n", 16, "", "YAML syntax error"));
}

TEST(ConfigRefuse, EmptyDocument) {
  EXPECT_TRUE(refused("", 1, "", "the document is empty"));
  EXPECT_TRUE(refused("# just a comment\n", 1, "", "the document is empty"));
}

TEST(ConfigRefuse, SecondDocument) {
  EXPECT_TRUE(refused(doc("") + "---\njob: {id: 8}\n", 17, "", "a second YAML document"));
}

TEST(ConfigRefuse, TopLevelIsNotAMapping) {
  EXPECT_TRUE(refused("- job\n- nodes\n", 1, "", "expected a mapping at the top, got a list"));
}

TEST(ConfigRefuse, UnknownKey) {
  EXPECT_TRUE(refused(doc("jobs: 1\n"), 4, "jobs", "unknown key (valid keys here: job, network"));
  EXPECT_TRUE(refused(doc("network:\n  mtuu: 1500\n"), 5, "network.mtuu",
                      "unknown key (valid keys here: mtu, udp_port"));
  std::string nodes = std::string(kNodes) + "    lcore: [3]\n";
  EXPECT_TRUE(refused(doc("", nodes), 16, "nodes[1].lcore", "unknown key"));
  EXPECT_TRUE(refused(doc("network:\n  <<: {mtu: 1500}\n"), 5, "network.<<",
                      "YAML merge keys are not supported"));
}

TEST(ConfigRefuse, KeyGivenTwice) {
  EXPECT_TRUE(refused(doc("network:\n  mtu: 1500\n  mtu: 9000\n"), 6, "network.mtu",
                      "key given twice (first on line 5)"));
}

TEST(ConfigRefuse, RequiredKeyMissing) {
  EXPECT_TRUE(refused("nodes: []\n", 1, "job", "required key is missing"));
  EXPECT_TRUE(refused("job:\n  name: demo\nnodes: []\n", 1, "job.id", "required key is missing"));
  EXPECT_TRUE(refused("job: {id: 1, name: x}\n", 1, "nodes", "required key is missing"));
  std::string nodes = "  - name: s0\n    role: server\n    ports: [ring:a]\n";
  EXPECT_TRUE(refused(doc("", nodes), 5, "nodes[0].ipv4", "required key is missing"));
}

TEST(ConfigRefuse, SectionIsNotAMapping) {
  EXPECT_TRUE(refused(doc("network: 5\n"), 4, "network", "expected a mapping, got \"5\""));
  EXPECT_TRUE(refused(doc("", "  - s0\n"), 5, "nodes[0]", "expected a mapping, got \"s0\""));
}

TEST(ConfigRefuse, IntegerExpected) {
  EXPECT_TRUE(
      refused(doc("network:\n  mtu: big\n"), 5, "network.mtu", "expected an integer, got \"big\""));
  EXPECT_TRUE(refused(doc("network:\n  mtu: 1500.0\n"), 5, "network.mtu", "expected an integer"));
  EXPECT_TRUE(
      refused(doc("network:\n  mtu:\n"), 5, "network.mtu", "expected an integer, got no value"));
  EXPECT_TRUE(
      refused(doc("network:\n  mtu: [1]\n"), 5, "network.mtu", "expected an integer, got a list"));
}

TEST(ConfigRefuse, QuotedNumberIsAString) {
  EXPECT_TRUE(refused(doc("network:\n  mtu: \"1500\"\n"), 5, "network.mtu",
                      "expected an integer, got the quoted string \"1500\""));
  EXPECT_TRUE(refused(doc("network:\n  mtu: !!int 1500\n"), 5, "network.mtu",
                      "expected an integer, got \"1500\" tagged tag:yaml.org,2002:int"));
}

TEST(ConfigRefuse, IntegerOutOfRange) {
  EXPECT_TRUE(
      refused(doc("network:\n  mtu: 575\n"), 5, "network.mtu", "575 is out of range (576..9000)"));
  EXPECT_TRUE(refused(doc("network:\n  mtu: 9001\n"), 5, "network.mtu", "out of range"));
  EXPECT_TRUE(refused("job:\n  id: -1\n", 2, "job.id", "-1 is out of range (0..4294967295)"));
  EXPECT_TRUE(refused("job:\n  id: 4294967296\n", 2, "job.id", "out of range"));
  EXPECT_TRUE(refused(doc("link: {seed: 18446744073709551616}\n"), 4, "link.seed",
                      "18446744073709551616 is out of range"));
}

TEST(ConfigRefuse, BooleanExpected) {
  EXPECT_TRUE(refused(doc("network:\n  udp_checksum: yes\n"), 5, "network.udp_checksum",
                      "expected true, false or auto, got \"yes\""));
}

TEST(ConfigRefuse, NumberExpected) {
  EXPECT_TRUE(
      refused(doc("link:\n  loss: lots\n"), 5, "link.loss", "expected a number, got \"lots\""));
  EXPECT_TRUE(refused(doc("link:\n  loss: .nan\n"), 5, "link.loss", "expected a number"));
}

TEST(ConfigRefuse, StringExpected) {
  EXPECT_TRUE(
      refused("job:\n  id: 1\n  name: [demo]\n", 3, "job.name", "expected a string, got a list"));
}

TEST(ConfigRefuse, ListExpected) {
  EXPECT_TRUE(refused(doc("eal:\n  extra: --log-level=8\n"), 5, "eal.extra",
                      "expected a list, got \"--log-level=8\""));
}

TEST(ConfigRefuse, NotOneOfTheChoices) {
  EXPECT_TRUE(refused(doc("network:\n  scheduler: prio\n"), 5, "network.scheduler",
                      "\"prio\" is not one of strict, fifo, partition"));
  EXPECT_TRUE(refused(doc("network:\n  poll: sleepy\n"), 5, "network.poll",
                      "\"sleepy\" is not one of adaptive, busy"));
  EXPECT_TRUE(refused(doc("", std::string(kNodes) + "    poll: spin\n"), 16, "nodes[1].poll",
                      "\"spin\" is not one of adaptive, busy"));
  EXPECT_TRUE(refused(doc("eal:\n  hugepages: yes\n"), 5, "eal.hugepages",
                      "\"yes\" is not one of auto, on, off"));
  EXPECT_TRUE(refused(doc("training:\n  sync: bulk\n"), 5, "training.sync",
                      "is not one of bsp, asp, ssp, psplus"));
  EXPECT_TRUE(refused(doc("training:\n  optimizer: lamb\n"), 5, "training.optimizer",
                      "is not one of sgd, momentum, adam, adamw, sum"));
  std::string nodes = "  - name: s0\n    role: boss\n";
  EXPECT_TRUE(refused(doc("", nodes), 6, "nodes[0].role", "\"boss\" is not one of server, worker"));
}

}  // namespace
}  // namespace mercury::config
