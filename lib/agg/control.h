// The parameter server's control messages: what workers and servers say to
// each other outside the gradient stream, carried as kControl transport
// messages (reliable, delivered whole).
//
// The job's life, as these messages tell it:
//   1. Each worker sends kDeclare to every server: its rank and the full,
//      ordered list of tensors it declared (name, element count, priority,
//      dtype).
//   2. A server waits for kDeclare from every rank the job file names. When
//      all lists are equal it computes agg::Placement (the same function of
//      the same list on every node) and answers each worker with kReady,
//      carrying the placement's fingerprint so the worker can prove it
//      computed the same one. A list that differs is answered with kRefused,
//      whose text names the rank and the first tensor that differs.
//   3. Rank 0 then pushes its initial parameters (wire type kInit); every
//      worker, rank 0 included, pulls them as version 0 of each chunk.
//   4. kBarrier / kBarrierDone implement Worker::barrier(): a worker sends
//      kBarrier(generation) to server 0, which answers every worker with
//      kBarrierDone(generation) once all ranks have arrived.
//   5. Settings and the job's state, while the job runs (docs/server.md,
//      "Settings and the job's state"): rank 0 sends kSettings(from version,
//      hyperparameters) to every server, each answers kSettingsDone once
//      every shard it runs applied them; any worker asks each server for
//      its shards' state page by page (kStatePull, answered kStatePage:
//      optimizer_state.h records); and a job that resumes from a checkpoint
//      starts with rank 0's kStateSeed pages (answered kStateSeeded) instead
//      of its kInit packets: rank 0's kDeclare says so and the version the
//      job resumes at, which every kReady repeats to every worker.
//   6. A worker that stops sends kLeave(rank) to every server and stops
//      polling once it is acknowledged (or after a keepalive interval): the
//      server sends it nothing more. Under BSP a push from any rank after
//      a rank left can never be aggregated, so it ends the job naming both;
//      once every rank has left the job is finished.
//   7. Membership (docs/membership.md): in the asynchronous modes a rank
//      that is lost (liveness) or left is removed from the job, and every
//      server tells every other rank with kWorkerGone(rank, lost, text). A
//      new process for a removed rank declares as in 1.; each server checks
//      its list against the job's and answers it kJoined (the placement as
//      kReady has it, and from server 0 the barrier generation it counts
//      from), then sends it every chunk's newest version, and tells every
//      other rank with kWorkerJoined(rank, text). A spare worker (a node
//      outside the ranks) announces itself to server 0 with a kDeclare of
//      rank kSpareRank and waits; server 0 gives it a removed rank with a
//      kJoined naming that rank, the spare declares that rank to the other
//      servers, which answer kJoined too; the job's end releases a spare
//      that waits with kReleased.
//   8. A hot standby (docs/durability.md) that named its server lost tells
//      every worker with kPromoted(version, text); a worker that has lost
//      the server too sends that server's traffic to it from then on. A
//      worker that the server still answers after the kPromoted came
//      answers kPromotionRefused(rank, text) instead: the pair was cut
//      apart, not the server lost, and the standby serves nothing. A server
//      that named its standby lost tells every worker with
//      kStandbyLost(text) and sends no update unreplicated before each has
//      acknowledged it; a worker that has it refuses that standby's
//      kPromoted too.
//   9. Several servers, one lost and started again with --resume
//      (docs/durability.md): each worker, once its kReady said the version
//      the job resumes at, sends kRollback(rank, version) to every other
//      server, which rolls its own state back to that version once every
//      rank has asked; a server with no checkpoint of it answers
//      kRollback(rank, its newest older version), and the worker asks every
//      server for that one instead.
//
// Encoding: a 4-byte magic "MPSC", a version byte, a kind byte, then the
// kind's fields, all big-endian. decode() validates every length against the
// buffer, so a malformed message is refused with a reason, never read out of
// bounds.
//
// Threads and costs: pure functions on caller-owned memory; control path
// only (they allocate and throw std::invalid_argument).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "agg/optimizer.h"
#include "agg/placement.h"

namespace mercury::agg {

enum class ControlKind : uint8_t {
  kDeclare = 1,      ///< worker -> server: rank + tensor list
  kReady = 2,        ///< server -> worker: placement fingerprint, global shard count
  kRefused = 3,      ///< server -> worker: the job cannot start; text says why
  kBarrier = 4,      ///< worker -> server 0: rank arrived at barrier `generation`
  kBarrierDone = 5,  ///< server 0 -> worker: every rank arrived at `generation`
  /// Either way, every heartbeat interval while the job runs: nothing to
  /// do on receipt. Its point is the sender's: a reliable message in flight
  /// keeps the transport's liveness clock running, so a peer that died while
  /// nothing else was outstanding is still named within the peer timeout.
  kHeartbeat = 6,
  kLeave = 7,  ///< worker -> every server: this rank is done with the job
  // Settings and the job's state (5. above). Each request carries a sequence
  // number its answer repeats; an answer's `text` is empty when it went well.
  kSettings = 8,      ///< rank 0 -> every server: `values` from version `version` on
  kSettingsDone = 9,  ///< server -> rank 0: every shard it runs applied them (or `text`)
  kStatePull = 10,    ///< worker -> server: its shards' state from `cursor` (0: the start)
  kStatePage = 11,    ///< server -> worker: `bytes`, next `cursor`, `last` page (or `text`)
  kStateSeed = 12,    ///< rank 0 -> server: `bytes` (records) to resume from; `last` page
  kStateSeeded = 13,  ///< server -> rank 0: the page was applied (or `text`)
  // Membership (7. above), a block of its own.
  /// server -> every other rank: rank `rank` is no longer in the job
  /// (`lost`: named dead by liveness or restarted; else it left); `text` says so.
  kWorkerGone = 20,
  /// server -> a new process of a removed rank: it joins the running job;
  /// `fingerprint`, `shards` and `version` as kReady's, `generation` the
  /// first barrier generation it takes part in (server 0's; 0 elsewhere),
  /// `rank` the rank it joins as (a spare's is the one it takes over).
  kJoined = 21,
  /// server -> every other rank: rank `rank` joined the job again; `text` says so.
  kWorkerJoined = 22,
  /// server 0 -> a spare that waits: the job ended without needing it; `text` says so.
  kReleased = 23,
  // A hot standby (docs/durability.md), a block of its own.
  /// standby -> every worker: it has named its server lost and serves that
  /// server's shards from now on, at `version` (its newest chunk's); `text`
  /// names it. The workers resend what the server had not answered.
  kPromoted = 30,
  /// worker -> standby: the worker's server answered it after the
  /// standby's kPromoted came, so the worker stays with the server and the
  /// standby must not serve (a partition between the pair?); `rank` the
  /// sender's, `text` says why.
  kPromotionRefused = 31,
  /// server -> every worker: it named its standby lost and, once every
  /// worker has acknowledged this, sends its updates unreplicated: that
  /// standby must never be followed; `text` names it.
  kStandbyLost = 32,
  /// worker -> every server still running, when another server resumed
  /// from its checkpoint at `version`: roll back to that version (from this
  /// server's own checkpoint of it) once every rank has asked; `rank` the
  /// sender's. server -> worker: no checkpoint of the version asked here;
  /// `version` is this server's newest older one, `rank` the worker's.
  kRollback = 40,
};

/// The rank a spare worker's first kDeclare (to server 0) carries: it has none yet.
inline constexpr uint32_t kSpareRank = UINT32_MAX;

struct ControlMessage {
  ControlKind kind = ControlKind::kDeclare;
  /// kDeclare, kBarrier, kLeave, kRollback, kPromotionRefused: the sender's rank (kSpareRank: a
  /// spare's announcement); kWorkerGone, kWorkerJoined: the one gone or
  /// joined; kJoined: the one the recipient joins as
  uint32_t rank = 0;
  std::vector<TensorDecl> tensors;  ///< kDeclare
  uint64_t fingerprint = 0;         ///< kReady, kJoined: Placement::fingerprint()
  uint32_t shards = 0;              ///< kReady, kJoined: global shard count of the job
  uint64_t generation = 0;          ///< kBarrier, kBarrierDone, kJoined
  /// kRefused, kWorkerGone, kWorkerJoined, kReleased, kPromoted, kPromotionRefused,
  /// kStandbyLost;
  /// kSettingsDone, kStatePage, kStateSeeded: "" or why not
  std::string text;
  /// kDeclare of rank 0: the job resumes from rank 0's kStateSeed pages at
  /// `version` instead of starting from its kInit packets at version 0.
  bool seeded = false;
  /// kDeclare (seeded), kReady, kJoined: the version the job starts at (kJoined
  /// under BSP: the iteration in progress, docs/membership.md); kSettings: the
  /// first version whose update uses `values`; kRollback: the version to
  /// roll back to.
  uint32_t version = 0;
  uint64_t sequence = 0;         ///< kSettings .. kStateSeeded: the request's number
  Hyperparameters values;        ///< kSettings
  uint64_t cursor = 0;           ///< kStatePull: where to go on; kStatePage: the next page's
  bool last = false;             ///< kStatePage, kStateSeed: no page follows
  std::vector<std::byte> bytes;  ///< kStatePage, kStateSeed: whole records (optimizer_state.h)
  bool lost = false;             ///< kWorkerGone: lost (liveness, a restart), not left
};

/// Bytes of `m`. Throws std::invalid_argument for a tensor name longer than
/// 65535 bytes or more than 2^32 - 1 tensors.
std::vector<std::byte> encode_control(const ControlMessage& m);

/// Parses `bytes`. Throws std::invalid_argument naming what is wrong
/// (bad magic, unknown version or kind, truncated field, trailing bytes,
/// a zero-element tensor, a tensor dtype that is not float32, bfloat16 or
/// float16).
ControlMessage decode_control(std::span<const std::byte> bytes);

/// "" when `a` and `b` are the same list; otherwise a sentence naming the
/// first difference (index and both tensors), for kRefused and error messages.
std::string first_difference(std::span<const TensorDecl> a, std::span<const TensorDecl> b);

}  // namespace mercury::agg
