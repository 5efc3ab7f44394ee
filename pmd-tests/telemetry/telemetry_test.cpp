// Counter groups served through rte_telemetry, read back over its socket the
// way dpdk-telemetry.py does (a SOCK_SEQPACKET connection to
// <runtime dir>/dpdk_telemetry.v2, one command, one JSON reply).
#include <gtest/gtest.h>
#include <rte_eal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "pmd_env.h"
#include "telemetry/telemetry.h"

namespace mercury::telemetry {
namespace {

std::string query(const std::string& command) {
  const std::string path = std::string(rte_eal_get_runtime_dir()) + "/dpdk_telemetry.v2";
  int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
  if (fd < 0) return "socket failed";
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  std::string reply;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    char buf[16384];
    ssize_t n = read(fd, buf, sizeof buf);  // the greeting: version, pid, max length
    if (n > 0 &&
        write(fd, command.data(), command.size()) == static_cast<ssize_t>(command.size())) {
      n = read(fd, buf, sizeof buf);
      if (n > 0) reply.assign(buf, static_cast<size_t>(n));
    }
  } else {
    reply = "connect to " + path + " failed: " + std::strerror(errno);
  }
  close(fd);
  return reply;
}

TEST(Telemetry, GroupsAreServedAndRead) {
  uint64_t rx = 7, drops = 0;
  Registry r;
  r.add("port0", [&](Values& v) {
    v.emplace_back("rx_packets", read_counter(rx));
    v.emplace_back("drops", read_counter(drops));
  });
  r.add("shard1", [&](Values& v) { v.emplace_back("aggregations", 3); });
  EXPECT_THROW(r.add("port0", [](Values&) {}), std::invalid_argument);
  EXPECT_THROW(r.add("bad name", [](Values&) {}), std::invalid_argument);
  r.expose();
  EXPECT_THROW(Registry().expose(), std::logic_error);

  rx = 1234;
  drops = 5;
  const std::string stats = query("/mercury/stats");
  EXPECT_NE(stats.find("\"/mercury/stats\""), std::string::npos) << stats;
  EXPECT_NE(stats.find("\"port0\":{\"rx_packets\":1234,\"drops\":5}"), std::string::npos) << stats;
  EXPECT_NE(stats.find("\"shard1\":{\"aggregations\":3}"), std::string::npos) << stats;
  const std::string groups = query("/mercury/groups");
  EXPECT_NE(groups.find("[\"port0\",\"shard1\"]"), std::string::npos) << groups;

  EXPECT_EQ(r.total("drops"), 5u);
  EXPECT_EQ(r.line({"rx_packets", "aggregations"}), "port0.rx_packets=1234 shard1.aggregations=3");
}

}  // namespace
}  // namespace mercury::telemetry

int main(int argc, char** argv) { return mercury::pmdtest::run_all_tests(argc, argv, {}); }
