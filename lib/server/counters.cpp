#include "server/counters.h"

namespace mercury::server {

std::string_view node_state_name(NodeState s) {
  switch (s) {
    case NodeState::kWaiting:
      return "waiting";
    case NodeState::kRunning:
      return "running";
    case NodeState::kRefused:
      return "refused";
    case NodeState::kStopped:
      return "stopped";
    case NodeState::kFinished:
      return "finished";
  }
  return "?";
}

std::string_view server_drop_name(ServerDrop d) {
  switch (d) {
    case ServerDrop::kNotRunning:
      return "not_running";
    case ServerDrop::kNotOurs:
      return "not_ours";
    case ServerDrop::kInitNotRank0:
      return "init_not_rank0";
    case ServerDrop::kBadType:
      return "bad_type";
    case ServerDrop::kShardRingFull:
      return "shard_ring_full";
    case ServerDrop::kControlTooBig:
      return "control_too_big";
    case ServerDrop::kBadControl:
      return "bad_control";
    case ServerDrop::kWrongRank:
      return "wrong_rank";
    case ServerDrop::kBarrierNotHere:
      return "barrier_not_here";
    case ServerDrop::kReplyNotQueued:
      return "reply_not_queued";
    case ServerDrop::kAfterLeave:
      return "after_leave";
    case ServerDrop::kInitResumed:
      return "init_resumed";
    case ServerDrop::kFromPartner:
      return "from_partner";
    case ServerDrop::kNotPromoted:
      return "not_promoted";
    case ServerDrop::kNotServing:
      return "not_serving";
    case ServerDrop::kRemovedRank:
      return "removed_rank";
    case ServerDrop::kRollingBack:
      return "rolling_back";
    case ServerDrop::kNoRank:
      return "no_rank";
    case ServerDrop::kCount:
      break;
  }
  return "?";
}

}  // namespace mercury::server
