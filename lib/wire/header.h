// The Mercury header: what follows UDP in every Mercury packet.
//
// Layout (64 bytes, all multi-byte fields big-endian; docs/wire-format.md is
// the reference and lib/wire/mercury.lua dissects it in Wireshark):
//
//   0 version  1 type  2 flags(16)  4 job_id(32)
//   8 sender_id(16) 10 priority(8) 11 dtype(8) 12 block_key(32)
//  16 msg_id(32) 20 msg_len(32) 24 offset(32) 28 iteration(32)
//  32 param_version(32) 36 seq(32) 40 ack(32) 44 payload_len(16) 46 credit(16)
//  48 sack(64) 56 epoch(32) 60 reserved(32)
//
// The codec is pure: it does not depend on DPDK and never allocates, so it is
// used alike by the datapath, the unit tests and the fuzz target. decode()
// validates everything a packet can lie about and returns a reason code for
// each rejection; nothing a packet carries can make it read out of bounds.
// Thread safety: free functions on caller-owned memory; no shared state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#if defined(__AVX512BW__)
#include <immintrin.h>
#endif

#include "wire/big_endian.h"
#include "wire/dtype.h"

namespace mercury::wire {

/// Bumped whenever a field changes meaning or a packet type is added
/// (5: the epoch widened to 32 bits, at 56; credit moved to 46; 6: dtypes
/// bfloat16 and float16).
inline constexpr uint8_t kVersion = 6;
/// UDP port used when a configuration does not name one.
inline constexpr uint16_t kDefaultUdpPort = 47100;

enum class PacketType : uint8_t {
  kData = 1,     ///< a slice of a message (a worker's push, or any transport message)
  kAggData = 2,  ///< a slice of an aggregated chunk, server to worker
  kAck = 3,      ///< a pure acknowledgement: no payload
  kControl = 4,  ///< control-plane message (declare, barrier, hello), carried reliably
  kInit = 5,     ///< a slice of rank 0's initial parameters, worker to server (start of a job)
  /// The P3/ByteScheduler baseline's start-up of one partition of a message
  /// (sched::SliceKind::kPartitionStart): no payload, carried reliably; the
  /// receiver's ACK is the answer and nothing is delivered.
  kPartitionStart = 6,
};

/// Flag bits.
namespace flags {
inline constexpr uint16_t kAckValid = 1u << 0;    ///< ack/sack fields carry an acknowledgement
inline constexpr uint16_t kRetransmit = 1u << 1;  ///< a resend: no RTT sample (Karn)
inline constexpr uint16_t kAckRequest = 1u << 2;  ///< receiver should ack at once (tail of a burst)
/// One packet of a slice of a larger logical message (msg_len is the logical
/// length, offset the byte offset in it): the receiver's transport does no
/// per-msg_id byte counting for it and hands it up packet by packet.
inline constexpr uint16_t kSlice = 1u << 3;
/// With kAckValid: since its previous ACK, the receiver got a packet twice,
/// once sent as a retransmission and once not, so a resend was not needed
/// (a one-bit D-SACK). The sender uses it to prove a timeout spurious.
inline constexpr uint16_t kDuplicate = 1u << 4;
/// On a pure ACK: it answers a probe of the sender's retransmission timer
/// (a pure ACK with kAckRequest and a non-zero `offset`, its token), and its
/// `offset` echoes that token. Its ACK covers everything the answering
/// receiver had when it read the probe.
inline constexpr uint16_t kAnswer = 1u << 5;
/// The packet is authenticated (docs/security.md): an AuthBlock follows
/// the header, before the payload, and payload_len does not count it.
inline constexpr uint16_t kAuth = 1u << 6;
inline constexpr uint16_t kKnown =
    kAckValid | kRetransmit | kAckRequest | kSlice | kDuplicate | kAnswer | kAuth;
}  // namespace flags

/// An aggregated chunk's (kAggData) `iteration` in the asynchronous modes
/// (ASP, SSP, PS+; 0 under BSP): bit 31 (kAggYours) is set when the update
/// applied the recipient's own gradient, bits 0-30 (kAggSlowestMask) hold the
/// chunk's slowest clock, the fewest gradients of any worker applied to it.
inline constexpr uint32_t kAggYours = 1u << 31;
inline constexpr uint32_t kAggSlowestMask = kAggYours - 1;

#pragma pack(push, 1)
struct Header {
  uint8_t version;
  uint8_t type;
  be16 flags;
  be32 job_id;
  be16 sender_id;    ///< the sending node's index in the job file (not a worker rank)
  uint8_t priority;  ///< 0 is the most urgent
  uint8_t dtype;
  /// The block the payload belongs to: its key, i.e. its index in the job's
  /// placement (agg/placement.h), not a tensor's index.
  be32 block_key;
  be32 msg_id;   ///< message number, per sender and receiver
  be32 msg_len;  ///< bytes in the whole message
  be32 offset;   ///< byte offset of this payload within the message
  /// A push (kData, kInit): the version of the parameters its gradient was
  /// computed from (0 for kInit). An aggregated chunk (kAggData): 0 under
  /// BSP, else kAggYours | slowest clock (above). Other types: 0.
  be32 iteration;
  /// An aggregated chunk (kAggData): the version its update made (0 for
  /// the initial values). A push (kData) in the asynchronous modes: the
  /// worker's clock, how many pushes of the tensor it made before this one
  /// (0 under BSP). Other types: 0 from Mercury's nodes.
  be32 param_version;
  be32 seq;          ///< transport sequence number of this packet
  be32 ack;          ///< cumulative: every seq below this was received
  be16 payload_len;  ///< bytes of payload after the header
  /// With kAckValid: the receiver's credit, how many sequence numbers from
  /// `ack` on the sender may have sent (flow control: it never sends what
  /// the receiver has no room for).
  be16 credit;
  be64 sack;  ///< bit i set: seq ack+1+i was received
  /// The sender's incarnation (job::fresh_epoch(): its start in milliseconds
  /// of the wall clock, mod 2^32, never 0); a restart makes a newer one.
  be32 epoch;
  be32 reserved32;  ///< sent as 0, ignored on receipt
};
#pragma pack(pop)

inline constexpr size_t kHeaderSize = 64;
static_assert(sizeof(Header) == kHeaderSize);

/// What follows the header of a packet with flags::kAuth: the sender's
/// packet counter towards this receiver (strictly increasing, across the
/// sender's restarts too) and the AES-GMAC tag over the header, the counter
/// and the payload (transport/auth.h; docs/security.md).
#pragma pack(push, 1)
struct AuthBlock {
  be64 counter;
  unsigned char tag[16];
};
#pragma pack(pop)
inline constexpr size_t kAuthSize = 24;
static_assert(sizeof(AuthBlock) == kAuthSize && alignof(AuthBlock) == 1);
static_assert(offsetof(Header, type) == 1);
static_assert(offsetof(Header, flags) == 2);
static_assert(offsetof(Header, job_id) == 4);
static_assert(offsetof(Header, sender_id) == 8);
static_assert(offsetof(Header, priority) == 10);
static_assert(offsetof(Header, dtype) == 11);
static_assert(offsetof(Header, block_key) == 12);
static_assert(offsetof(Header, msg_id) == 16);
static_assert(offsetof(Header, msg_len) == 20);
static_assert(offsetof(Header, offset) == 24);
static_assert(offsetof(Header, iteration) == 28);
static_assert(offsetof(Header, param_version) == 32);
static_assert(offsetof(Header, seq) == 36);
static_assert(offsetof(Header, ack) == 40);
static_assert(offsetof(Header, payload_len) == 44);
static_assert(offsetof(Header, credit) == 46);
static_assert(offsetof(Header, sack) == 48);
static_assert(offsetof(Header, epoch) == 56);
static_assert(offsetof(Header, reserved32) == 60);
static_assert(alignof(Header) == 1);

/// Host-order view of a header: what protocol code reads and fills. The
/// fields mean what Header's of the same name do.
struct HeaderFields {
  PacketType type = PacketType::kData;
  /// Unused. Named so the whole struct is initialised: it keeps the layout
  /// of the wire header (where the version is), which encode_summed() loads
  /// in one piece.
  uint8_t reserved = 0;
  uint16_t flags = 0;
  uint32_t job_id = 0;
  uint16_t sender_id = 0;
  uint8_t priority = 0;
  Dtype dtype = Dtype::kBytes;
  uint32_t block_key = 0;
  uint32_t msg_id = 0;
  uint32_t msg_len = 0;
  uint32_t offset = 0;
  uint32_t iteration = 0;
  uint32_t param_version = 0;
  uint32_t seq = 0;
  uint32_t ack = 0;
  uint16_t payload_len = 0;
  uint16_t credit = 0;
  uint64_t sack = 0;
  uint32_t epoch = 0;
  uint32_t reserved32 = 0;  ///< the wire's reserved field: sent as 0, ignored on receipt

  bool operator==(const HeaderFields&) const = default;
};

/// Why decode() refused a header. Every value has a drop counter.
enum class Reject : uint8_t {
  kNone = 0,
  kTruncated,         ///< fewer bytes than a header
  kBadVersion,        ///< version is not kVersion
  kBadType,           ///< type is not a PacketType
  kBadFlags,          ///< unknown flag bits set
  kBadDtype,          ///< dtype is not a Dtype (wire/dtype.h)
  kPayloadMismatch,   ///< payload_len disagrees with the bytes that follow
  kAckWithPayload,    ///< an ACK packet carries payload
  kStartWithPayload,  ///< a kPartitionStart packet carries payload
  kBadRange,          ///< offset + payload_len runs past msg_len
  /// offset, payload_len or msg_len not a multiple of the dtype's element
  /// size (4 for float32, 2 for bfloat16 and float16)
  kBadAlignment,
  kCount,
};
inline constexpr size_t kRejectCount = static_cast<size_t>(Reject::kCount);

/// A short stable name for a rejection ("truncated", "bad_version", ...),
/// used in counters and logs.
std::string_view reject_name(Reject r);

/// Writes `f` into `out`. `out` must hold kHeaderSize bytes.
void encode(const HeaderFields& f, std::span<std::byte, kHeaderSize> out);
void encode(const HeaderFields& f, Header& out);

/// The sum of the header's 16-bit big-endian words as encode() would write
/// them, computed from the values (not from memory), for a ones'-complement
/// checksum over the header. Summing memory the CPU has just written with
/// narrower stores stalls on store forwarding; this does not touch memory.
/// The result is unfolded: fold it to 16 bits before use.
uint64_t header_word_sum(const HeaderFields& f);

#if defined(__AVX512BW__)
// HeaderFields is laid out as the wire header, field for field, except that
// its byte 0 holds the type (the wire's holds the version) and byte 1 is
// `reserved`: encode_summed() byte-swaps it in one shuffle.
static_assert(sizeof(HeaderFields) == kHeaderSize);
static_assert(offsetof(HeaderFields, flags) == offsetof(Header, flags));
static_assert(offsetof(HeaderFields, job_id) == offsetof(Header, job_id));
static_assert(offsetof(HeaderFields, sender_id) == offsetof(Header, sender_id));
static_assert(offsetof(HeaderFields, priority) == offsetof(Header, priority));
static_assert(offsetof(HeaderFields, dtype) == offsetof(Header, dtype));
static_assert(offsetof(HeaderFields, block_key) == offsetof(Header, block_key));
static_assert(offsetof(HeaderFields, msg_id) == offsetof(Header, msg_id));
static_assert(offsetof(HeaderFields, msg_len) == offsetof(Header, msg_len));
static_assert(offsetof(HeaderFields, offset) == offsetof(Header, offset));
static_assert(offsetof(HeaderFields, iteration) == offsetof(Header, iteration));
static_assert(offsetof(HeaderFields, param_version) == offsetof(Header, param_version));
static_assert(offsetof(HeaderFields, seq) == offsetof(Header, seq));
static_assert(offsetof(HeaderFields, ack) == offsetof(Header, ack));
static_assert(offsetof(HeaderFields, payload_len) == offsetof(Header, payload_len));
static_assert(offsetof(HeaderFields, credit) == offsetof(Header, credit));
static_assert(offsetof(HeaderFields, sack) == offsetof(Header, sack));
static_assert(offsetof(HeaderFields, epoch) == offsetof(Header, epoch));
static_assert(offsetof(HeaderFields, reserved32) == offsetof(Header, reserved32));

/// encode(f, out) with out.payload_len = payload_len, in a few vector
/// instructions: one load of `f`, one byte shuffle, one masked store. Returns
/// the header's partial ones'-complement sum as net::partial_sum over the 64
/// written bytes would give it (native 16-bit words, unfolded), taken from
/// the register, not read back from memory.
inline uint64_t encode_summed(const HeaderFields& f, uint16_t payload_len, Header& out) {
  static_assert(kHeaderSize == 64, "the header is one 64-byte register");
  constexpr __mmask64 kHeaderBytes = ~__mmask64{0};
  __m512i v = _mm512_maskz_loadu_epi8(kHeaderBytes, &f);
  // 16-bit word 22 is payload_len.
  v = _mm512_mask_set1_epi16(v, __mmask32{1} << (offsetof(HeaderFields, payload_len) / 2),
                             static_cast<short>(payload_len));
  // Per 16-byte lane, the source byte of each wire byte (-1: zero). Lane 0:
  // version (0, ORed in below), type, flags, job_id, sender_id, priority,
  // dtype, block_key; lane 1: four 32-bit fields; lane 2: three 32-bit and
  // two 16-bit fields; lane 3: sack, epoch and the reserved field.
  const __m512i order = _mm512_set_epi8(12, 13, 14, 15, 8, 9, 10, 11, 0, 1, 2, 3, 4, 5, 6, 7,  //
                                        14, 15, 12, 13, 8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3,  //
                                        12, 13, 14, 15, 8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3,  //
                                        12, 13, 14, 15, 11, 10, 8, 9, 4, 5, 6, 7, 2, 3, 0, -1);
  v = _mm512_or_si512(_mm512_shuffle_epi8(v, order), _mm512_maskz_set1_epi8(1, kVersion));
  _mm512_mask_storeu_epi8(&out, kHeaderBytes, v);
  const __m512i halves = _mm512_add_epi32(_mm512_and_si512(v, _mm512_set1_epi32(0xffff)),
                                          _mm512_maskz_srli_epi32(0xffff, v, 16));
  alignas(64) uint32_t lanes[16];
  _mm512_store_si512(lanes, halves);
  uint64_t sum = 0;
  for (const uint32_t l : lanes) sum += l;
  return sum;
}
#endif

/// Reads and validates the header at the start of `packet` (header plus
/// payload: everything after the UDP header). On success fills `out` and
/// returns Reject::kNone; otherwise returns the first rule the packet breaks
/// and leaves `out` unspecified.
Reject decode(std::span<const std::byte> packet, HeaderFields& out);

}  // namespace mercury::wire
