// Ethernet / ARP / IPv4 / UDP framing for Mercury packets, without DPDK.
//
// build_*() write a whole frame into caller memory; parse_frame() classifies
// a received frame down to the Mercury header and validates every length,
// checksum and field on the way, returning a DropReason for anything that is
// not a well-formed packet for this endpoint. Being pure, the same code runs
// on mbuf data in the datapath, in the unit tests and under libFuzzer.
//
// Costs: building a frame is one pass over the payload (copy fused with the
// UDP checksum when it is computed in software); parsing touches the 106
// header bytes plus one read-only pass over the payload to verify a software
// UDP checksum. Neither allocates, throws nor logs. Thread safety: none
// needed; functions only touch the memory they are given.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "wire/big_endian.h"
#include "wire/header.h"

namespace mercury::net {

using wire::be16;
using wire::be32;

struct MacAddr {
  std::array<uint8_t, 6> bytes{};
  bool operator==(const MacAddr&) const = default;
  [[nodiscard]] bool is_broadcast() const {
    return bytes == std::array<uint8_t, 6>{0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  }
  [[nodiscard]] bool is_zero() const { return bytes == std::array<uint8_t, 6>{}; }
  [[nodiscard]] std::string to_string() const;
  static MacAddr broadcast() { return MacAddr{{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}}; }
};

/// Host-order IPv4 address helpers.
std::string ipv4_to_string(uint32_t ip);

#pragma pack(push, 1)
struct EtherHeader {
  std::array<uint8_t, 6> dst;
  std::array<uint8_t, 6> src;
  be16 ether_type;
};
struct ArpPacket {
  be16 htype;
  be16 ptype;
  uint8_t hlen;
  uint8_t plen;
  be16 oper;
  std::array<uint8_t, 6> sha;
  be32 spa;
  std::array<uint8_t, 6> tha;
  be32 tpa;
};
struct Ipv4Header {
  uint8_t version_ihl;
  uint8_t tos;
  be16 total_length;
  be16 id;
  be16 fragment;
  uint8_t ttl;
  uint8_t protocol;
  be16 checksum;
  be32 src;
  be32 dst;
};
struct UdpHeader {
  be16 src_port;
  be16 dst_port;
  be16 length;
  be16 checksum;
};
#pragma pack(pop)
static_assert(sizeof(EtherHeader) == 14);
static_assert(sizeof(ArpPacket) == 28);
static_assert(sizeof(Ipv4Header) == 20);
static_assert(sizeof(UdpHeader) == 8);

inline constexpr uint16_t kEtherTypeIpv4 = 0x0800;
inline constexpr uint16_t kEtherTypeArp = 0x0806;
inline constexpr uint8_t kIpProtoUdp = 17;
inline constexpr uint16_t kIpDontFragment = 0x4000;
inline constexpr uint8_t kDefaultTtl = 64;
inline constexpr size_t kL2Len = sizeof(EtherHeader);
inline constexpr size_t kL3Len = sizeof(Ipv4Header);
inline constexpr size_t kL4Len = sizeof(UdpHeader);
/// Bytes in front of the Mercury payload: Ethernet + IPv4 + UDP + Mercury.
inline constexpr size_t kFrameOverhead = kL2Len + kL3Len + kL4Len + wire::kHeaderSize;
/// Ethernet frames shorter than this are padded by the sender.
inline constexpr size_t kMinFrame = 60;
/// Largest IP MTU the stack accepts (jumbo frames).
inline constexpr uint32_t kMaxMtu = 9000;

/// Mercury payload bytes that fit an IP MTU, rounded down to whole 64-byte
/// cache lines (1408 at MTU 1500, 8896 at 9000, 448 at 576). A message is
/// cut at multiples of it, so in a buffer on a 64-byte boundary (a tensor, a
/// receive buffer) every packet's payload covers whole lines: the receiver
/// places it with non-temporal stores only, never a partial line that must
/// first be read from memory, and the sender's fill and the server's
/// aggregation load whole lines. It costs at most 60 bytes of a packet
/// (0.6 % at 1500); it bought the memif receiver about 5 % of goodput
/// (benchmarks/README.md, "Measured design decisions"). A multiple of 4
/// too, so a float32 never straddles two packets.
/// With `auth`, the packet also carries a wire::AuthBlock (1344 bytes at
/// 1500, 8832 at 9000).
constexpr uint32_t payload_per_packet(uint32_t mtu, bool auth = false) {
  return (mtu - static_cast<uint32_t>(kL3Len + kL4Len + wire::kHeaderSize) -
          (auth ? static_cast<uint32_t>(wire::kAuthSize) : 0u)) &
         ~63u;
}

/// This endpoint's addresses on one port.
struct LocalAddr {
  MacAddr mac;
  uint32_t ip = 0;  ///< host order
  uint16_t udp_port = wire::kDefaultUdpPort;
};

/// Ethernet+IPv4+UDP headers for one (local, destination) pair, built once
/// so the send path copies 42 bytes and patches two lengths and checksums.
struct FrameTemplate {
  static constexpr size_t kSize = kL2Len + kL3Len + kL4Len;
  std::array<std::byte, kSize> bytes{};
  uint64_t ip_sum = 0;      ///< partial sum of the IPv4 header, length and checksum zero
  uint64_t pseudo_sum = 0;  ///< pseudo-header addresses and protocol (length added per packet)
  uint64_t udp_sum = 0;     ///< pseudo_sum plus both UDP ports
  bool valid = false;
};

/// Where a frame goes: resolved once per peer, reused for every packet.
struct Route {
  MacAddr dst_mac;
  uint32_t dst_ip = 0;
  uint16_t dst_port = wire::kDefaultUdpPort;
  FrameTemplate frame;  ///< filled by Interface::resolve_st (or make_frame_template)
};

FrameTemplate make_frame_template(const LocalAddr& local, const Route& route);

enum class ChecksumMode : uint8_t {
  kSoftware,  ///< the stack computes (TX) and verifies (RX) checksums
  kOffload,   ///< the NIC computes on TX; RX trusts the NIC's verdict flags
  kNone,      ///< UDP checksum 0 (IPv4 allows it); the IP header checksum is still used
};

/// Every reason a received frame is not delivered. Each has a counter.
enum class DropReason : uint8_t {
  kFrameTruncated,    ///< shorter than an Ethernet header
  kSegmented,         ///< arrived in a chain of mbufs: Mercury frames fit one segment
  kNotOurMac,         ///< destination MAC is neither ours nor broadcast
  kUnknownEtherType,  ///< neither IPv4 nor ARP (VLAN, IPv6, LLDP, ...)
  kArpMalformed,      ///< ARP for something other than IPv4 over Ethernet, or short
  kArpNotForUs,       ///< ARP whose target is another host: normal on a shared LAN
  kIpTruncated,       ///< shorter than the IPv4 header or its total length claims
  kIpBadHeader,       ///< version is not 4, or IHL < 5
  kIpBadChecksum,     ///< header checksum does not verify
  kIpFragment,        ///< fragments are never sent by Mercury and never reassembled
  kNotOurIp,          ///< destination IPv4 is not ours
  kNotUdp,            ///< IPv4 protocol is not UDP
  kUdpBadLength,      ///< UDP length disagrees with the IP payload
  kUdpBadChecksum,    ///< UDP checksum does not verify
  kNotOurPort,        ///< UDP destination port is not ours
  kMercury,           ///< the Mercury header was rejected: see the wire::Reject counters
  kCount,
};
inline constexpr size_t kDropReasonCount = static_cast<size_t>(DropReason::kCount);
std::string_view drop_reason_name(DropReason r);

/// What parse_frame() found.
enum class FrameKind : uint8_t { kMercury, kArp, kDrop };

struct ParsedFrame {
  FrameKind kind = FrameKind::kDrop;
  DropReason drop = DropReason::kFrameTruncated;  ///< valid when kind == kDrop
  wire::Reject reject = wire::Reject::kNone;      ///< valid when drop == kMercury
  MacAddr src_mac;
  uint32_t src_ip = 0;
  uint16_t src_port = 0;
  wire::HeaderFields header;           ///< kMercury
  std::span<const std::byte> payload;  ///< kMercury: the bytes after the Mercury header
  /// kMercury: the Mercury header as received (kHeaderSize bytes), which an
  /// authenticated packet's MAC covers.
  const std::byte* wire_header = nullptr;
  /// kMercury with wire::flags::kAuth: its AuthBlock (after the header,
  /// before `payload`); nullptr otherwise.
  const wire::AuthBlock* auth = nullptr;
  uint16_t arp_oper = 0;       ///< kArp: 1 request, 2 reply
  uint32_t arp_target_ip = 0;  ///< kArp
};

/// How much verification parse_frame() does itself.
struct RxChecks {
  bool verify_ip_checksum = true;   ///< false when the NIC flagged it good
  bool verify_udp_checksum = true;  ///< false when the NIC flagged it good or it is disabled
};

/// Classifies `frame` (Ethernet header first). Never reads outside it.
void parse_frame(std::span<const std::byte> frame, const LocalAddr& local, RxChecks checks,
                 ParsedFrame& out);

/// Writes Ethernet+IPv4+UDP+Mercury headers and copies the payload into
/// `out`, which must hold kFrameOverhead + payload.size() bytes (and at least
/// kMinFrame), plus wire::kAuthSize when `auth` is given: it is written
/// after the Mercury header, whose flags must then hold wire::flags::kAuth.
/// Fills h.payload_len. With ChecksumMode::kOffload the IPv4
/// checksum is left 0 and the UDP checksum holds the pseudo-header sum, as
/// DPDK's TX checksum offload expects. Returns the frame length.
size_t build_data_frame(std::span<std::byte> out, const LocalAddr& local, const Route& route,
                        wire::HeaderFields h, std::span<const std::byte> payload, ChecksumMode mode,
                        const wire::AuthBlock* auth = nullptr);
/// The same from a prebuilt template: the send path's per-packet form.
size_t build_data_frame(std::span<std::byte> out, const FrameTemplate& t,
                        const wire::HeaderFields& h, std::span<const std::byte> payload,
                        ChecksumMode mode, const wire::AuthBlock* auth = nullptr);

/// The headers of that frame alone, for a payload sent from where it lies
/// as the frame's second segment: writes kFrameOverhead bytes into `out`
/// (Ethernet, IPv4, UDP, Mercury; lengths and checksums covering `payload`,
/// which is read, not copied, and only for a software UDP checksum) and
/// returns kFrameOverhead (plus wire::kAuthSize, the AuthBlock after the
/// Mercury header, when `auth` is given). kFrameOverhead + payload.size()
/// must be at least kMinFrame: such a frame has no room for padding.
size_t build_data_headers(std::span<std::byte> out, const FrameTemplate& t,
                          const wire::HeaderFields& h, std::span<const std::byte> payload,
                          ChecksumMode mode, const wire::AuthBlock* auth = nullptr);

/// Writes an ARP request (oper 1, broadcast) or reply (oper 2) frame of
/// kMinFrame bytes into `out`. Returns its length.
size_t build_arp_frame(std::span<std::byte> out, uint16_t oper, const LocalAddr& local,
                       const MacAddr& target_mac, uint32_t target_ip);

}  // namespace mercury::net
