// The job's control plane on one server node, as a pure state machine: no
// DPDK, no endpoint. The node (ServerNode) decodes each control message a
// worker sent (agg/control.h), hands it over with the sender's rank (which
// the transport knows: the rank of the peer it came from) and the current
// time, then sends the answers this machine queued, in order.
//
// States (NodeState):
//  * kWaiting: every rank must declare (kDeclare: its rank and tensor list).
//    A rank declaring again replaces its list (counted as repeated). Rank
//    0's declare also says whether the job resumes from its checkpoint, and
//    at which version (seeded(), start_version(); kReady repeats the
//    version to every rank; the node runs the resume, job_state.h). When
//    the last rank is in, every list is compared with rank 0's: equal, the
//    placement is computed (agg::Placement::compute over the job's global
//    shard count) and handed to the Starter, which builds what runs on it
//    (the node's shards); then every rank is answered kReady(fingerprint,
//    shards) and the state is kRunning. A list that differs (the refusal
//    names the rank and the first difference), a placement that cannot be
//    computed or a Starter that fails refuse the job: every rank is answered
//    kRefused with the reason.
//  * kRunning: a worker the transport declared dead ends the job for every
//    rank (kRefused naming it, counted as workers_lost): under BSP the
//    others would wait for its gradients for ever. So does a worker that
//    restarted (a new incarnation: its transport came back with a new
//    epoch, or it declared again; counted as workers_restarted), in every
//    sync mode: its new process holds none of the job's state (no version,
//    no round), and a job does not take a rank back. Every rank, the new
//    incarnation included, is answered kRefused naming it.
//    In the asynchronous modes (`asynchronous`) no rank waits for another's
//    gradients: a lost or restarted rank is removed from the job instead
//    (docs/membership.md), as is one that left. A BSP job that shrinks
//    (`shrinks`, training.on_worker_loss shrink) removes a lost or
//    restarted rank the same way, but rank 0 (the job ends, as above), and
//    refuses its new process alone; a rank that left stays needed. A BSP
//    job that waits (wait_for_lost, training.on_worker_loss wait) keeps the
//    rank in its sets and waits for its new process, at most a limit (then
//    the job is refused): its declare is checked, the node finds the
//    iteration in progress, and finish_join_st answers it kJoined. Every other rank still in
//    the job is told (kWorkerGone), the node's shards are told
//    (take_membership_st), and barriers complete without it. A new process
//    of a removed rank joins: its declare's list is checked against the
//    job's (one that differs is refused to it alone, naming the
//    difference), and
//    it is answered kJoined (the placement, and the first barrier
//    generation it takes part in: one past every generation a rank has
//    reached); every other rank is told (kWorkerJoined) and the shards
//    send it every chunk's newest version (take_membership_st).
//    A rank's kLeave (it stops; the node sends it nothing more) marks it
//    left; once every rank has left (or was removed) the state is
//    kFinished. Under BSP a rank
//    that left is needed by every later round, so a push from any rank after
//    a leave (on_push_after_leave_st) ends the job for every rank (kRefused
//    naming both: they ran different numbers of rounds).
//  * kWaiting, kLeave or a restart: the rank's declare is withdrawn (the job
//    waits for its new declare).
//  * kRunning, a declare from a rank that left: refused to that rank only
//    (the others may still be finishing their last round).
//  * kRefused: every later declare is answered kRefused with the reason.
//  * kFinished: every rank left; declares are refused (the job is done).
//  * kStopped: the node stopped (its shard cores are gone); declares get no
//    answer.
// In every state, a declare or barrier whose rank field is not the sender's
// rank is answered kRefused (to that rank only, naming both) and changes
// nothing else (ControlVerdict::kWrongRank).
//
// Spare workers (asynchronous jobs, add_spares; docs/membership.md, "Spare
// workers"): nodes outside the ranks, peers workers()..peers()-1 after the
// ranks. A spare announces itself to server 0 (kDeclare of rank
// agg::kSpareRank) and waits. When a rank has been removed (lost or
// restarted, not left) for the grace without a new process of its own
// joining, server 0 gives it the lowest spare that waits: the spare's peer
// speaks for the rank from then on (peer_of, rank_of_peer), it joins as a
// restarted process does (kJoined naming the rank), every other rank is
// told, and the rank's own node is refused from then on. The spare then
// declares that rank to the other servers, which take it in the same way.
// The job's end releases a spare that waits (kReleased); a refused job
// refuses it. Replies are addressed to peers (ControlReply::rank).
//
// Barrier (server 0 only; elsewhere ControlVerdict::kBarrierNotHere):
// kBarrier(rank, generation) from every rank, then kBarrierDone(generation)
// to every rank. Generations may complete out of order (a process's trainer
// threads can be in two barriers at once): every generation below the floor
// is complete, and the complete ones above it are kept in a set until the
// floor reaches them, so the set stays small. A rank asking about a complete
// generation is answered again; a rank repeating an incomplete one is only
// counted.
//
// Threads: one owner (the node's net core), nothing is shared. Costs:
// control path only; it allocates (lists, replies, the placement).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agg/control.h"
#include "agg/placement.h"
#include "base/owner.h"
#include "server/counters.h"

namespace mercury::server {

/// One answer to send: `message` to peer `rank` (a rank's, or a spare's:
/// ControlPlane::peer_of).
struct ControlReply {
  uint16_t rank = 0;
  agg::ControlMessage message;
};

/// What the control plane made of one message. The node counts all but
/// kTaken as a ServerDrop of the same name.
enum class ControlVerdict : uint8_t {
  kTaken,
  kWrongRank,       ///< its rank field is not the sender's: answered kRefused
  kBarrierNotHere,  ///< a barrier, and this is not server 0
  kBadControl,      ///< a kind servers send (kReady, kRefused, kBarrierDone)
  kNoRank,          ///< from a spare that holds no rank, or a node whose rank a spare took over
};

class ControlPlane {
 public:
  using Tick = uint64_t;
  /// Builds what runs on `placement` (which outlives the call and, once the
  /// job runs, the control plane's life); returns "" or why the job cannot
  /// start, which refuses it. Called at most once.
  using Starter = std::function<std::string(const agg::Placement&)>;

  /// Waiting for the declares of ranks 0..rank_names.size()-1 (1..64 of
  /// them; rank_names[r] names rank r in refusals). `job_shards` is the
  /// job's global shard count; `runs_barrier` is true on server 0. Throws
  /// std::invalid_argument for no ranks, too many, or no shards.
  /// `placement` is how the workers cut the tensors into blocks
  /// (job::placement_options): the server computes the same placement.
  /// `asynchronous`: the job's sync mode needs no rank to apply another's
  /// gradients (asp, ssp, psplus), so a lost rank is removed, not fatal.
  /// `shrinks` (BSP only: training.on_worker_loss shrink): a lost or
  /// restarted rank but rank 0 is removed as in an asynchronous job, its
  /// new process refused alone; the shards' sets then need the other ranks
  /// only (take_membership_st).
  ControlPlane(std::vector<std::string> rank_names, uint32_t job_shards, bool runs_barrier,
               Starter start, Tick now, agg::PlacementOptions placement = {},
               bool asynchronous = false, bool shrinks = false);

  /// A message from `rank` (< workers()), as the transport delivered it.
  ControlVerdict on_message_st(uint16_t rank, agg::ControlMessage m, Tick now);
  /// The transport gave up on `rank`: while running, the job ends for every
  /// rank, or in an asynchronous job the rank is removed. Otherwise nothing
  /// changes (a worker that has not declared yet holds up no gradient).
  void on_worker_lost_st(uint16_t rank, Tick now);
  /// The transport saw `rank` come back with a new epoch (its process
  /// restarted). While running (and it is still in the job), the job ends
  /// for every rank, the new incarnation included, or in an asynchronous
  /// job the rank is removed (its new process is refused when it declares);
  /// while waiting, its declare is withdrawn (the new incarnation declares
  /// again). Otherwise nothing changes.
  void on_worker_restarted_st(uint16_t rank, Tick now);
  /// While running, a push (a gradient packet) arrived from `rank` after
  /// another rank had left: the job ends for every rank (kRefused). Under
  /// BSP such a push can never be aggregated: the rank that left was done
  /// with every round it will take part in.
  void on_push_after_leave_st(uint16_t rank, Tick now);
  /// The ranks that left (bit r: rank r sent kLeave while running).
  [[nodiscard]] uint64_t left() const { return left_; }
  [[nodiscard]] bool has_left(uint32_t rank) const { return (left_ >> rank & 1) != 0; }
  /// The ranks removed from an asynchronous job or a BSP job that shrank
  /// (lost or restarted; bit r).
  [[nodiscard]] uint64_t removed() const { return removed_; }
  /// Whether `rank` is out of the job: it left or was removed. Such a rank
  /// is sent nothing more and its liveness is not checked.
  [[nodiscard]] bool gone(uint32_t rank) const { return ((left_ | removed_) >> rank & 1) != 0; }
  /// BSP, on_worker_loss wait: the ranks lost whose new process has not
  /// joined yet (bit r; awaited, or joining: finish_join_st not called).
  /// Their sets wait for them; they are sent nothing, their liveness is not
  /// checked.
  [[nodiscard]] uint64_t waited_for() const { return awaited_ | joining_; }
  /// Neither gone nor waited for: sent heartbeats, broadcasts, and checked.
  [[nodiscard]] bool in_job(uint32_t rank) const {
    return ((left_ | removed_ | awaited_ | joining_) >> rank & 1) == 0;
  }

  /// BSP, training.on_worker_loss wait (before the job runs): a lost or
  /// restarted rank is waited for, at most `limit` ticks (`setting` names
  /// it in the texts, e.g. "training.worker_wait_s 60 s"), its sets holding
  /// what its old incarnation gave; its new process's declare is checked
  /// against the job's list (refused alone if it differs) and then joins:
  /// take_membership_st() gives {rank, joined}, the node finds the
  /// iteration in progress and calls finish_join_st(). Past the limit, the
  /// job is refused for every rank (check_waits_st). No effect on an
  /// asynchronous job or one that shrinks.
  void wait_for_lost(Tick limit, std::string setting);
  /// The iteration in progress of a joining rank's new process, `version`:
  /// it is answered kJoined (version, and the barrier generation it takes
  /// part from: the highest a rank has reached) and every other rank
  /// kWorkerJoined. False (nothing sent) if the rank is no longer joining.
  bool finish_join_st(uint16_t rank, uint32_t version);
  /// Whether `rank` is joining (finish_join_st still to come).
  [[nodiscard]] bool joining(uint32_t rank) const { return (joining_ >> rank & 1) != 0; }
  /// A rank waited for past its limit refuses the job for every rank; true
  /// then. Slow path (the node's periodic work).
  bool check_waits_st(Tick now);
  /// Asynchronous jobs and BSP jobs that shrink: a rank that went out of
  /// the job (removed, or in an asynchronous job left), whose state the
  /// node's shards must drop (Shard::remove_rank_st), or a new process of
  /// one that joined (asynchronous: Shard::join_rank_st).
  struct MembershipChange {
    uint16_t rank = 0;
    bool joined = false;
    friend bool operator==(const MembershipChange&, const MembershipChange&) = default;
  };
  /// The changes since the last call, in the order they happened.
  std::vector<MembershipChange> take_membership_st();

  // ---- spare workers (docs/membership.md, "Spare workers") ----
  /// Before the job runs, an asynchronous job only (else nothing changes):
  /// spare s is peer workers() + s, named `names[s]` (1..64 ranks and
  /// spares in all; throws std::invalid_argument beyond). A rank removed
  /// for `grace` ticks is given to a spare that waits (server 0 decides).
  void add_spares(std::vector<std::string> names, Tick grace);
  /// Ranks and spares: the peers the node maps its transport peers to.
  [[nodiscard]] uint32_t peers() const { return static_cast<uint32_t>(peer_rank_.size()); }
  /// The rank peer `peer` speaks for now: its own, or the one a spare took
  /// over; nullopt for a spare that holds none and for a rank's own node
  /// once a spare took its rank.
  [[nodiscard]] std::optional<uint32_t> rank_of_peer(uint32_t peer) const {
    if (peer >= peer_rank_.size() || peer_rank_[peer] == kNoPeer) return std::nullopt;
    return peer_rank_[peer];
  }
  /// The peer that speaks for rank `rank` (< workers()) now.
  [[nodiscard]] uint32_t peer_of(uint32_t rank) const { return rank_peer_[rank]; }
  /// A message from peer `peer` (< peers()), as the transport delivered it:
  /// the rank's it speaks for (on_message_st), or a spare's.
  ControlVerdict on_peer_message_st(uint32_t peer, agg::ControlMessage m, Tick now);
  /// The transport gave up on peer `peer`, or saw it come back with a new
  /// epoch: on_worker_lost_st / on_worker_restarted_st of the rank it
  /// speaks for; a spare that waits is forgotten (its new process
  /// announces itself again).
  void on_peer_lost_st(uint32_t peer, Tick now);
  void on_peer_restarted_st(uint32_t peer, Tick now);
  /// Server 0, slow path: each rank removed for the grace goes to the
  /// lowest spare that waits. True when one did (replies queued).
  bool check_spares_st(Tick now);
  /// Whether peer `peer` is a spare that waits here (announced, no rank):
  /// sent heartbeats, its liveness checked.
  [[nodiscard]] bool spare_waits(uint32_t peer) const {
    return peer >= workers() && peer < peers() && (spares_waiting_ >> (peer - workers()) & 1) != 0;
  }
  /// A spare's peer took rank `rank` over (its transport peer speaks for
  /// the rank from now on), since the last call, in order.
  struct Takeover {
    uint16_t rank = 0;
    uint32_t peer = 0;
    friend bool operator==(const Takeover&, const Takeover&) = default;
  };
  std::vector<Takeover> take_takeovers_st();

  /// Lines for the node's output since the last call (a rank removed).
  std::vector<std::string> take_notices_st();
  /// The node stopped serving (its shard cores are gone): a running job
  /// becomes kStopped.
  void on_stopped_st(Tick now);
  /// The job cannot go on (a resume failed): while running, every rank is
  /// answered kRefused with `why`. Otherwise nothing changes.
  void refuse_st(std::string why, Tick now);
  /// Whether rank 0's declare resumes the job from its checkpoint, and the
  /// version the job starts at (0 unless it resumes): rank 0's latest.
  [[nodiscard]] bool seeded() const { return seeded_; }
  [[nodiscard]] uint32_t start_version() const { return start_version_; }
  /// Before the job starts: this server resumes from its own checkpoint at
  /// `version` (ps-server --resume), which every kReady carries whatever
  /// rank 0 declares.
  void resume_at(uint32_t version) {
    own_version_ = version;
    start_version_ = version;
  }

  /// The job rolled back to a checkpoint (docs/durability.md, "Several
  /// servers"): every rank counts its barrier generations from 0 again
  /// (Worker::roll_back), so the generations seen are forgotten.
  void restart_barriers_st() {
    MERCURY_OWNED(owner_);
    barrier_arrived_.clear();
    barrier_completed_.clear();
    barrier_floor_ = 0;
  }

  /// The net core's thread changed (ServerNode::hand_over).
  void hand_over() { owner_.hand_over(); }

  /// The answers queued since the last call, in the order they were made.
  std::vector<ControlReply> take_replies_st();

  [[nodiscard]] NodeState state() const { return state_; }
  /// Why the job is kRefused ("" otherwise): the text every rank was sent.
  [[nodiscard]] const std::string& refusal() const { return refusal_; }
  /// The placement once running (null before, and after a refusal at start).
  [[nodiscard]] const agg::Placement* placement() const { return placement_; }
  /// When the state last changed (the construction's `now` at first).
  [[nodiscard]] Tick since() const { return since_; }
  [[nodiscard]] const ControlCounters& counters() const { return counters_; }
  [[nodiscard]] uint32_t workers() const { return static_cast<uint32_t>(names_.size()); }

 private:
  void on_declare(uint16_t rank, agg::ControlMessage& m, Tick now);
  ControlVerdict on_barrier(uint16_t rank, const agg::ControlMessage& m);
  void on_leave(uint16_t rank, Tick now);
  void end_restarted(uint16_t rank, const char* how, Tick now);
  void remove(uint16_t rank, bool lost, const std::string& why, Tick now);
  void await(uint16_t rank, const std::string& why, Tick now);
  void await_declare(uint16_t rank, const std::vector<agg::TensorDecl>& tensors, Tick now);
  // A new process (or a spare) at control peer `peer`, named `who`, whose
  // list is not the job's is refused alone: true then.
  bool refuse_another_list(uint32_t peer, const std::string& who,
                           const std::vector<agg::TensorDecl>& tensors);
  // `text` to every other rank in the job (kWorkerJoined) and the node's
  // output; kJoined (the placement, `version`, `generation`) to `rank`.
  void announce_join(uint16_t rank, const std::string& text, uint32_t version, uint64_t generation);
  // `text` ("" for a rank's new process) says who joined.
  void join(uint16_t rank, const std::vector<agg::TensorDecl>& tensors, std::string text = "");
  // Spares (control_plane_spares.cpp).
  ControlVerdict on_spare_st(uint32_t spare, agg::ControlMessage& m, Tick now);
  void take_over(uint16_t rank, uint32_t spare, const std::vector<agg::TensorDecl>& tensors,
                 Tick now);
  void release_spares(const std::string& why, bool refused);
  void on_peer_gone(uint32_t peer, bool restarted, Tick now);
  void reply_peer(uint32_t peer, agg::ControlMessage m);
  static constexpr uint32_t kNoPeer = UINT32_MAX;
  [[nodiscard]] std::string rank_text(uint16_t rank) const;
  void finish_if_all_gone(Tick now);
  // Barrier generations every rank still in the job has reached: answered.
  void complete_barriers();
  [[nodiscard]] uint64_t barrier_needs(uint64_t generation) const;
  bool sender_is(uint16_t rank, uint32_t claimed, const char* what);
  void start(Tick now);
  void refuse_all(std::string why, bool answering_declares, Tick now);
  void enter(NodeState s, Tick now);
  void reply(uint16_t rank, agg::ControlMessage m);
  void reply_refused(uint16_t rank, std::string text);
  void reply_refused_peer(uint32_t peer, std::string text);
  void reply_ready(uint16_t rank);

  std::vector<std::string> names_;
  uint32_t job_shards_;
  agg::PlacementOptions placement_options_;
  bool runs_barrier_;
  Starter start_;
  NodeState state_ = NodeState::kWaiting;
  Tick since_;
  std::string refusal_;
  std::optional<agg::Placement> owned_placement_;
  const agg::Placement* placement_ = nullptr;
  std::vector<std::optional<std::vector<agg::TensorDecl>>> declared_;  // per rank
  bool seeded_ = false;                           // rank 0's declare: the job resumes
  uint32_t start_version_ = 0;                    // ... at this version
  std::optional<uint32_t> own_version_;           // resume_at's
  std::map<uint64_t, uint64_t> barrier_arrived_;  // incomplete generation -> rank bitmap
  uint64_t barrier_floor_ = 0;                    // every generation below is complete
  uint64_t left_ = 0;                             // bit r: rank r left while running
  bool asynchronous_ = false;                     // a lost rank is removed, not fatal
  bool shrinks_ = false;                          // BSP: a lost rank but 0 is removed
  bool waits_ = false;                            // BSP: a lost rank is waited for
  Tick wait_limit_ = 0;                           // ... this long
  std::string wait_setting_;                      // ... named so
  uint64_t awaited_ = 0;                          // bit r: rank r lost, waited for
  uint64_t joining_ = 0;                          // bit r: its new process joins
  std::vector<Tick> wait_until_;                  // per rank: when the wait ends
  std::vector<std::string> wait_why_;             // per rank: why it is waited for
  uint64_t removed_ = 0;                          // bit r: rank r removed (lost, restarted)
  std::vector<MembershipChange> changes_;         // for the shards, not taken yet
  std::vector<uint64_t> joined_at_;               // per rank: first barrier generation it needs
  std::vector<std::string> notices_;
  // Spares: their names, the grace, the peer -> rank map (kNoPeer: none)
  // and back, the spares that wait (bit s) with their lists, when each rank
  // was removed, and the takeovers for the node.
  std::vector<std::string> spare_names_;
  Tick spare_grace_ = 0;
  std::vector<uint32_t> peer_rank_;
  std::vector<uint32_t> rank_peer_;
  uint64_t spares_waiting_ = 0;
  std::vector<std::vector<agg::TensorDecl>> spare_lists_;
  std::vector<Tick> removed_at_;
  std::vector<Takeover> takeovers_;
  std::set<uint64_t> barrier_completed_;  // complete generations >= the floor
  std::vector<ControlReply> replies_;
  ControlCounters counters_;
  base::Owner owner_;  // the node's net core
};

}  // namespace mercury::server
