#include "worker/timeline.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace mercury::worker {
namespace {

constexpr uint32_t kChunkBytes = 1408;

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

struct TimelineTest : ::testing::Test {
  std::vector<float> a = std::vector<float>(100);
  std::vector<float> b = std::vector<float>(10);
  TensorTable table;
  std::string path = ::testing::TempDir() + "/timeline_test.json";

  void SetUp() override {
    table.declare("late \"layer\"\n", a, 5);  // a name that needs JSON escapes
    table.declare("first", b, 0);
    table.freeze(1, kChunkBytes);
  }
  void TearDown() override { std::remove(path.c_str()); }
};

using Mark = Timeline::Mark;

TEST_F(TimelineTest, EachIterationsMarksBecomeItsFourPhasesOnTheTensorsRow) {
  Timeline t(path, "w3", 3);
  for (uint32_t it = 0; it < 2; ++it) {
    for (Mark m :
         {Mark::kRequested, Mark::kSending, Mark::kPushed, Mark::kFirstChunk, Mark::kComplete}) {
      t.mark_st(1, it, m);
    }
  }
  ASSERT_EQ(t.write(table), "");
  const std::string out = read(path);
  for (const char* phase : {"\"queued\"", "\"push\"", "\"aggregate\"", "\"pull\""}) {
    EXPECT_EQ(count(out, std::string("{\"name\":") + phase), 2u) << phase << "\n" << out;
  }
  EXPECT_EQ(count(out, "\"tid\":1001,\"ts\""), 8u);  // tensor 1's row
  EXPECT_NE(out.find("\"iteration\":1,\"bytes\":40"), std::string::npos);
  EXPECT_NE(out.find("{\"name\":\"w3\"}"), std::string::npos);
  EXPECT_NE(out.find("\"pid\":3"), std::string::npos);
  // Rows in priority order: "first" (priority 0) sorts before tensor 0.
  EXPECT_NE(out.find("\"tid\":1001,\"args\":{\"sort_index\":1000}"), std::string::npos);
  EXPECT_NE(out.find("\"tid\":1000,\"args\":{\"sort_index\":1001}"), std::string::npos);
  EXPECT_NE(out.find("\"late \\\"layer\\\"\\u000a\""), std::string::npos);
  EXPECT_EQ(out.find(",\n]}"), std::string::npos);  // no trailing comma
  EXPECT_EQ(out.substr(out.size() - 3), "]}\n");
}

TEST_F(TimelineTest, APhaseMissingAMarkOrEndingBeforeItStartsIsLeftOut) {
  Timeline t(path, "w0", 0);
  t.mark_st(0, 0, Mark::kRequested);  // never sent: no queued phase
  t.mark_st(0, 1, Mark::kSending);
  t.mark_st(0, 1, Mark::kFirstChunk);  // the aggregate overtook the last ack
  t.mark_st(0, 1, Mark::kPushed);
  t.mark_st(0, 1, Mark::kComplete);
  ASSERT_EQ(t.write(table), "");
  const std::string out = read(path);
  EXPECT_EQ(count(out, "{\"name\":\"queued\""), 0u);
  EXPECT_EQ(count(out, "{\"name\":\"push\""), 1u);
  EXPECT_EQ(count(out, "{\"name\":\"aggregate\""), 0u);
  EXPECT_EQ(count(out, "{\"name\":\"pull\""), 1u);
}

TEST_F(TimelineTest, TrainerSpansGetARowPerTrackInFirstUseOrder) {
  Timeline t(path, "w0", 0);
  t.span("conv1", "forward", 1'000'000, 3'500'000);
  t.span("fc", "backward", 4'000'000, 5'000'000);
  t.span("conv2", "forward", 3'500'000, 3'000'000);  // an end before its begin: empty
  ASSERT_EQ(t.write(table), "");
  const std::string out = read(path);
  EXPECT_NE(out.find("\"tid\":1,\"args\":{\"name\":\"forward\"}"), std::string::npos);
  EXPECT_NE(out.find("\"tid\":2,\"args\":{\"name\":\"backward\"}"), std::string::npos);
  EXPECT_NE(out.find("{\"name\":\"conv1\",\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":1000.000,"
                     "\"dur\":2500.000}"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("\"name\":\"conv2\",\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":3500.000,"
                     "\"dur\":0.000"),
            std::string::npos);
}

TEST_F(TimelineTest, EventsBeyondTheReservationAreCountedNotStored) {
  Timeline t(path, "w0", 0, 3);
  for (int i = 0; i < 5; ++i) t.mark_st(0, 0, Mark::kRequested);
  EXPECT_EQ(t.dropped(), 2u);
}

TEST_F(TimelineTest, AnUnwritablePathIsReportedWithItsName) {
  Timeline t("/nonexistent-dir/w0.json", "w0", 0);
  const std::string why = t.write(table);
  EXPECT_NE(why.find("/nonexistent-dir/w0.json"), std::string::npos) << why;
  EXPECT_NE(why.find("No such file"), std::string::npos) << why;
}

}  // namespace
}  // namespace mercury::worker
