// The node's bookkeeping of settings and the job's state (job_state.h),
// without shards: each task is "run" by the test, which checks what each
// shard was asked to do and what every request is answered.
#include "server/job_state.h"

#include <gtest/gtest.h>

#include <vector>

#include "agg/optimizer_state.h"

namespace mercury::server {
namespace {

struct Submitted {
  uint32_t slot;
  ShardTask* task;
};

class JobStateTest : public ::testing::Test {
 protected:
  JobStateTest()
      : placement_(agg::Placement::compute(
            std::vector<agg::TensorDecl>{{"a", 3000, 0}, {"b", 5000, 1}, {"c", 70, 2}}, 2)),
        state_([this](uint32_t slot, ShardTask& t) {
          submitted_.push_back({slot, &t});
        }) {}

  void start(bool seeded, uint32_t version = 0) {
    state_.start_st(placement_, {0, 1}, 2, version, seeded);
  }
  agg::ControlMessage message(agg::ControlKind kind, uint64_t sequence) {
    agg::ControlMessage m;
    m.kind = kind;
    m.sequence = sequence;
    return m;
  }
  std::vector<ControlReply> poll(std::string* refusal = nullptr) {
    std::vector<ControlReply> replies;
    std::string why;
    state_.poll_st(replies, why);
    if (refusal != nullptr) *refusal = why;
    return replies;
  }
  // The hyperparameter record, then a chunk of every block at `version`.
  std::vector<std::byte> state_file(uint32_t version) {
    std::vector<std::byte> page;
    const agg::HyperparameterTable table(agg::OptimizerKind::kSgd, false, {},
                                         agg::SettingsMode::kFromVersion);
    page.resize(agg::hyperparameter_record_bytes(table));
    agg::encode_hyperparameter_record(placement_.fingerprint(), table, page);
    for (const agg::Block& b : placement_.blocks()) append_chunk(page, b.key, version);
    return page;
  }
  // A record of the job's: a chunk of block `key` at `version`, or the settings.
  void append_chunk(std::vector<std::byte>& page, uint32_t key, uint32_t version) {
    const std::vector<float> params(4, 1.0f);
    const size_t at = page.size();
    page.resize(at + agg::chunk_record_bytes(agg::OptimizerKind::kSgd, 4));
    agg::encode_chunk_record(placement_.fingerprint(),
                             {.key = key, .offset = 0, .version = version, .steps = version},
                             params, {}, {}, std::span(page).subspan(at));
  }

  agg::Placement placement_;
  std::vector<Submitted> submitted_;
  JobState state_;
};

TEST_F(JobStateTest, NothingIsTakenBeforeTheJobRuns) {
  state_.on_message_st(0, message(agg::ControlKind::kSettings, 3));
  const std::vector<ControlReply> r = poll();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].message.kind, agg::ControlKind::kSettingsDone);
  EXPECT_EQ(r[0].message.sequence, 3u);
  EXPECT_EQ(r[0].message.text, "the job is not running");
  EXPECT_TRUE(submitted_.empty());
}

TEST_F(JobStateTest, SettingsGoToEveryShardFromRank0Only) {
  start(false);
  state_.on_message_st(1, message(agg::ControlKind::kSettings, 1));
  std::vector<ControlReply> r = poll();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].rank, 1u);
  EXPECT_NE(r[0].message.text.find("settings come from rank 0"), std::string::npos);
  EXPECT_EQ(state_.counters().state_refused, 1u);

  agg::ControlMessage m = message(agg::ControlKind::kSettings, 2);
  m.version = 7;
  m.values.learning_rate = 0.5f;
  state_.on_message_st(0, std::move(m));
  ASSERT_EQ(submitted_.size(), 2u);
  for (uint32_t s = 0; s < 2; ++s) {
    EXPECT_EQ(submitted_[s].slot, s);
    EXPECT_EQ(submitted_[s].task->kind, ShardTask::Kind::kSettings);
    EXPECT_EQ(submitted_[s].task->version, 7u);
    EXPECT_EQ(submitted_[s].task->values.learning_rate, 0.5f);
  }
  submitted_[0].task->finish("");
  EXPECT_TRUE(poll().empty());  // shard 1 has not answered
  EXPECT_TRUE(state_.pending_st());
  submitted_[1].task->finish("settings from version 7 too_late");
  r = poll();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].message.kind, agg::ControlKind::kSettingsDone);
  EXPECT_EQ(r[0].message.text, "shard 1: settings from version 7 too_late");
  EXPECT_FALSE(state_.pending_st());
  EXPECT_EQ(state_.counters().settings, 2u);
}

TEST_F(JobStateTest, PagesWalkEveryShardWithTheCursor) {
  start(false);
  state_.on_message_st(2, message(agg::ControlKind::kStatePull, 5));
  ASSERT_EQ(submitted_.size(), 1u);
  EXPECT_EQ(submitted_[0].slot, 0u);
  EXPECT_EQ(submitted_[0].task->first, 0u);
  submitted_[0].task->bytes = {std::byte{9}};
  submitted_[0].task->next = 12;
  submitted_[0].task->finish("");
  std::vector<ControlReply> r = poll();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].rank, 2u);
  EXPECT_EQ(r[0].message.kind, agg::ControlKind::kStatePage);
  EXPECT_EQ(r[0].message.cursor, 12u);  // shard slot 0, chunk 12
  EXPECT_FALSE(r[0].message.last);
  EXPECT_EQ(r[0].message.bytes.size(), 1u);

  agg::ControlMessage next = message(agg::ControlKind::kStatePull, 5);
  next.cursor = 12;
  state_.on_message_st(2, std::move(next));
  submitted_[1].task->end = true;
  submitted_[1].task->finish("");
  r = poll();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].message.cursor, uint64_t{1} << 32);  // on to shard slot 1
  EXPECT_FALSE(r[0].message.last);

  next = message(agg::ControlKind::kStatePull, 5);
  next.cursor = uint64_t{1} << 32;
  state_.on_message_st(2, std::move(next));
  EXPECT_EQ(submitted_[2].slot, 1u);
  submitted_[2].task->end = true;
  submitted_[2].task->finish("");
  r = poll();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(r[0].message.last);

  next = message(agg::ControlKind::kStatePull, 6);
  next.cursor = uint64_t{2} << 32;
  state_.on_message_st(2, std::move(next));
  r = poll();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(r[0].message.last);
  EXPECT_NE(r[0].message.text.find("names no shard"), std::string::npos);
}

TEST_F(JobStateTest, ASeedIsTakenOnlyFromRank0OfAResumingJob) {
  start(false);
  state_.on_message_st(0, message(agg::ControlKind::kStateSeed, 1));
  std::string refusal;
  std::vector<ControlReply> r = poll(&refusal);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].message.kind, agg::ControlKind::kStateSeeded);
  EXPECT_NE(r[0].message.text.find("did not declare"), std::string::npos);
  EXPECT_EQ(refusal, "");  // the job did not resume: nothing to end
}

TEST_F(JobStateTest, ASeedGoesToItsShardsThenEveryShardIsChecked) {
  start(true, 4);
  const std::vector<std::byte> page = state_file(4);
  agg::ControlMessage m = message(agg::ControlKind::kStateSeed, 8);
  m.last = true;
  m.bytes = page;
  state_.on_message_st(1, agg::ControlMessage(m));  // not rank 0
  std::string refusal;
  std::vector<ControlReply> r = poll(&refusal);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_NE(r[0].message.text.find("from rank 0"), std::string::npos);
  EXPECT_EQ(refusal, "");
  ASSERT_TRUE(submitted_.empty());

  state_.on_message_st(0, std::move(m));
  ASSERT_EQ(submitted_.size(), 2u);
  size_t chunks = 0;
  for (const Submitted& s : submitted_) {
    EXPECT_EQ(s.task->kind, ShardTask::Kind::kRestore);
    EXPECT_EQ(s.task->version, 4u);
    ASSERT_FALSE(s.task->records.empty());
    EXPECT_EQ(s.task->records[0].header.type, agg::RecordType::kHyperparameters);
    for (size_t i = 1; i < s.task->records.size(); ++i) {
      EXPECT_EQ(placement_.at(s.task->records[i].header.key).shard, s.slot);
      ++chunks;
    }
    s.task->finish("");
  }
  EXPECT_EQ(chunks, placement_.blocks().size());
  // The last page: every shard is asked for chunks without values; one has 3.
  EXPECT_TRUE(poll().empty());
  ASSERT_EQ(submitted_.size(), 4u);
  EXPECT_EQ(submitted_[2].task->kind, ShardTask::Kind::kCheck);
  submitted_[2].task->finish("");
  submitted_[3].task->next = 3;
  submitted_[3].task->finish("");
  r = poll(&refusal);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].message.text, "the checkpoint gives no values to 3 chunks of shard 1");
  EXPECT_EQ(refusal, "cannot resume from rank 0's checkpoint: " + r[0].message.text);
}

TEST_F(JobStateTest, ATornSeedPageEndsTheResume) {
  start(true, 4);
  std::vector<std::byte> page;
  append_chunk(page, 0, 4);
  page.pop_back();
  agg::ControlMessage m = message(agg::ControlKind::kStateSeed, 8);
  m.bytes = page;
  state_.on_message_st(0, std::move(m));
  std::string refusal;
  const std::vector<ControlReply> r = poll(&refusal);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_NE(r[0].message.text.find("truncated"), std::string::npos) << r[0].message.text;
  EXPECT_NE(refusal, "");
  EXPECT_TRUE(submitted_.empty());
}

// A running server rolls back (docs/durability.md, "Several servers"): its
// own checkpoint's records go to their shards as kRollBack tasks at the
// version, nobody is answered, and a shard that fails ends the job.
TEST_F(JobStateTest, ARollbackRestoresEveryShardAtItsVersionAndAFailureEndsTheJob) {
  start(false);
  const std::vector<std::byte> file = state_file(30);
  state_.roll_back_st(file, 30);
  ASSERT_EQ(submitted_.size(), 2u);
  for (const Submitted& s : submitted_) {
    EXPECT_EQ(s.task->kind, ShardTask::Kind::kRollBack);
    EXPECT_EQ(s.task->version, 30u);
    ASSERT_FALSE(s.task->records.empty());
    EXPECT_EQ(s.task->records[0].header.type, agg::RecordType::kHyperparameters);
  }
  EXPECT_TRUE(state_.pending_st());
  submitted_[0].task->finish("");
  std::string refusal;
  EXPECT_TRUE(poll(&refusal).empty());
  EXPECT_TRUE(state_.pending_st());
  submitted_[1].task->finish("");
  EXPECT_TRUE(poll(&refusal).empty());  // nobody asked
  EXPECT_EQ(refusal, "");
  EXPECT_FALSE(state_.pending_st());

  // Again, and one shard refuses a record.
  submitted_.clear();
  state_.roll_back_st(file, 30);
  ASSERT_EQ(submitted_.size(), 2u);
  submitted_[0].task->finish("");
  submitted_[1].task->finish("the checkpoint gives no values to 2 chunks");
  EXPECT_TRUE(poll(&refusal).empty());
  EXPECT_EQ(refusal,
            "cannot roll back to version 30 from this server's checkpoint: shard 1: the "
            "checkpoint gives no values to 2 chunks");
}

}  // namespace
}  // namespace mercury::server
