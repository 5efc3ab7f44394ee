#include "net/frame.h"

#include <cstdio>
#include <cstring>

#include "net/checksum.h"

namespace mercury::net {

std::string MacAddr::to_string() const {
  char buf[18];
  std::snprintf(buf, sizeof buf, "%02x:%02x:%02x:%02x:%02x:%02x", bytes[0], bytes[1], bytes[2],
                bytes[3], bytes[4], bytes[5]);
  return buf;
}

std::string ipv4_to_string(uint32_t ip) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%u.%u.%u.%u", ip >> 24, (ip >> 16) & 0xff, (ip >> 8) & 0xff,
                ip & 0xff);
  return buf;
}

std::string_view drop_reason_name(DropReason r) {
  switch (r) {
    case DropReason::kFrameTruncated:
      return "frame_truncated";
    case DropReason::kSegmented:
      return "segmented";
    case DropReason::kNotOurMac:
      return "not_our_mac";
    case DropReason::kUnknownEtherType:
      return "unknown_ether_type";
    case DropReason::kArpMalformed:
      return "arp_malformed";
    case DropReason::kArpNotForUs:
      return "arp_not_for_us";
    case DropReason::kIpTruncated:
      return "ip_truncated";
    case DropReason::kIpBadHeader:
      return "ip_bad_header";
    case DropReason::kIpBadChecksum:
      return "ip_bad_checksum";
    case DropReason::kIpFragment:
      return "ip_fragment";
    case DropReason::kNotOurIp:
      return "not_our_ip";
    case DropReason::kNotUdp:
      return "not_udp";
    case DropReason::kUdpBadLength:
      return "udp_bad_length";
    case DropReason::kUdpBadChecksum:
      return "udp_bad_checksum";
    case DropReason::kNotOurPort:
      return "not_our_port";
    case DropReason::kMercury:
      return "mercury_header";
    case DropReason::kCount:
      break;
  }
  return "unknown";
}

namespace {

// Sum of the UDP pseudo-header (source, destination, protocol, UDP length).
uint64_t pseudo_header_sum(const Ipv4Header& ip, uint16_t udp_len) {
  uint64_t acc = partial_sum(&ip.src, 8);
  be16 proto_len[2];
  proto_len[0].set(kIpProtoUdp);
  proto_len[1].set(udp_len);
  return partial_sum(proto_len, sizeof proto_len, acc);
}

// Checksums are computed on native words and so are already in network
// order when stored natively: bypass BigEndian's byte swap.
void store_checksum(be16& field, uint16_t native) {
  std::memcpy(reinterpret_cast<unsigned char*>(&field), &native, sizeof native);
}

void drop(ParsedFrame& out, DropReason r) {
  out.kind = FrameKind::kDrop;
  out.drop = r;
}

void parse_arp(std::span<const std::byte> body, const LocalAddr& local, ParsedFrame& out) {
  if (body.size() < sizeof(ArpPacket)) return drop(out, DropReason::kArpMalformed);
  const auto& arp = *reinterpret_cast<const ArpPacket*>(body.data());
  const uint16_t oper = arp.oper.get();
  if (arp.htype.get() != 1 || arp.ptype.get() != kEtherTypeIpv4 || arp.hlen != 6 || arp.plen != 4 ||
      (oper != 1 && oper != 2)) {
    return drop(out, DropReason::kArpMalformed);
  }
  out.src_mac.bytes = arp.sha;
  out.src_ip = arp.spa.get();
  out.arp_oper = oper;
  out.arp_target_ip = arp.tpa.get();
  if (out.arp_target_ip != local.ip) return drop(out, DropReason::kArpNotForUs);
  out.kind = FrameKind::kArp;
}

}  // namespace

void parse_frame(std::span<const std::byte> frame, const LocalAddr& local, RxChecks checks,
                 ParsedFrame& out) {
  if (frame.size() < kL2Len) return drop(out, DropReason::kFrameTruncated);
  const auto& eth = *reinterpret_cast<const EtherHeader*>(frame.data());
  MacAddr dst{eth.dst};
  if (dst != local.mac && !dst.is_broadcast()) return drop(out, DropReason::kNotOurMac);
  out.src_mac.bytes = eth.src;
  const uint16_t ether_type = eth.ether_type.get();
  auto l3 = frame.subspan(kL2Len);
  if (ether_type == kEtherTypeArp) return parse_arp(l3, local, out);
  if (ether_type != kEtherTypeIpv4) return drop(out, DropReason::kUnknownEtherType);

  if (l3.size() < kL3Len) return drop(out, DropReason::kIpTruncated);
  const auto& ip = *reinterpret_cast<const Ipv4Header*>(l3.data());
  const size_t ihl = (ip.version_ihl & 0x0f) * 4u;
  if ((ip.version_ihl >> 4) != 4 || ihl < kL3Len) return drop(out, DropReason::kIpBadHeader);
  const size_t total = ip.total_length.get();
  // Ethernet pads short frames, so the IP length may be less than what follows.
  if (total < ihl || total > l3.size()) return drop(out, DropReason::kIpTruncated);
  if (checks.verify_ip_checksum && fold_sum(partial_sum(l3.data(), ihl)) != 0xffff) {
    return drop(out, DropReason::kIpBadChecksum);
  }
  if ((ip.fragment.get() & 0x3fff) != 0) return drop(out, DropReason::kIpFragment);
  if (ip.dst.get() != local.ip) return drop(out, DropReason::kNotOurIp);
  if (ip.protocol != kIpProtoUdp) return drop(out, DropReason::kNotUdp);
  out.src_ip = ip.src.get();

  auto l4 = l3.subspan(ihl, total - ihl);
  if (l4.size() < kL4Len) return drop(out, DropReason::kUdpBadLength);
  const auto& udp = *reinterpret_cast<const UdpHeader*>(l4.data());
  if (udp.length.get() != l4.size()) return drop(out, DropReason::kUdpBadLength);
  if (checks.verify_udp_checksum) {
    // A zero checksum means "none"; this job runs with checksums, so a packet
    // without one is as suspect as one that does not verify.
    if (udp.checksum.get() == 0 ||
        fold_sum(partial_sum(l4.data(), l4.size(),
                             pseudo_header_sum(ip, static_cast<uint16_t>(l4.size())))) != 0xffff) {
      return drop(out, DropReason::kUdpBadChecksum);
    }
  }
  if (udp.dst_port.get() != local.udp_port) return drop(out, DropReason::kNotOurPort);
  out.src_port = udp.src_port.get();

  auto mercury = l4.subspan(kL4Len);
  out.reject = wire::decode(mercury, out.header);
  if (out.reject != wire::Reject::kNone) return drop(out, DropReason::kMercury);
  out.wire_header = mercury.data();
  if ((out.header.flags & wire::flags::kAuth) != 0) {
    // decode() checked that the block is there.
    out.auth = reinterpret_cast<const wire::AuthBlock*>(mercury.data() + wire::kHeaderSize);
    out.payload = mercury.subspan(wire::kHeaderSize + wire::kAuthSize);
  } else {
    out.auth = nullptr;
    out.payload = mercury.subspan(wire::kHeaderSize);
  }
  out.kind = FrameKind::kMercury;
}

FrameTemplate make_frame_template(const LocalAddr& local, const Route& route) {
  FrameTemplate t;
  std::byte* p = t.bytes.data();
  auto& eth = *reinterpret_cast<EtherHeader*>(p);
  eth.dst = route.dst_mac.bytes;
  eth.src = local.mac.bytes;
  eth.ether_type.set(kEtherTypeIpv4);
  auto& ip = *reinterpret_cast<Ipv4Header*>(p + kL2Len);
  ip.version_ihl = 0x45;
  ip.tos = 0;
  ip.total_length.set(0);
  ip.id.set(0);
  ip.fragment.set(kIpDontFragment);
  ip.ttl = kDefaultTtl;
  ip.protocol = kIpProtoUdp;
  ip.checksum.set(0);
  ip.src.set(local.ip);
  ip.dst.set(route.dst_ip);
  auto& udp = *reinterpret_cast<UdpHeader*>(p + kL2Len + kL3Len);
  udp.src_port.set(local.udp_port);
  udp.dst_port.set(route.dst_port);
  udp.length.set(0);
  udp.checksum.set(0);
  t.ip_sum = partial_sum(&ip, kL3Len);
  t.pseudo_sum = pseudo_header_sum(ip, 0);
  t.udp_sum = partial_sum(&udp, 4, t.pseudo_sum);
  t.valid = true;
  return t;
}

size_t build_data_frame(std::span<std::byte> out, const LocalAddr& local, const Route& route,
                        wire::HeaderFields h, std::span<const std::byte> payload, ChecksumMode mode,
                        const wire::AuthBlock* auth) {
  return build_data_frame(out, make_frame_template(local, route), h, payload, mode, auth);
}

namespace {

// The frame's headers, and its payload after them when `copy` (otherwise
// the payload stays where it is, summed for the UDP checksum if need be, and
// travels as a second segment).
template <bool copy>
size_t build_data(std::span<std::byte> out, const FrameTemplate& t, const wire::HeaderFields& h,
                  std::span<const std::byte> payload, ChecksumMode mode,
                  const wire::AuthBlock* auth) {
  const size_t extra = auth != nullptr ? wire::kAuthSize : 0;
  const auto udp_len = static_cast<uint16_t>(kL4Len + wire::kHeaderSize + extra + payload.size());
  const auto ip_len = static_cast<uint16_t>(kL3Len + udp_len);
  std::byte* p = out.data();
  std::memcpy(p, t.bytes.data(), FrameTemplate::kSize);
  auto& ip = *reinterpret_cast<Ipv4Header*>(p + kL2Len);
  auto& udp = *reinterpret_cast<UdpHeader*>(p + kL2Len + kL3Len);
  ip.total_length.set(ip_len);
  udp.length.set(udp_len);

  const auto payload_len = static_cast<uint16_t>(payload.size());
  auto& mh = *reinterpret_cast<wire::Header*>(p + FrameTemplate::kSize);
  std::byte* data = p + FrameTemplate::kSize + wire::kHeaderSize + extra;

  // The payload before the Mercury header. The caller has usually just
  // written some of `h`, and stores drain in order: read at once, `h` would
  // wait behind the previous frame's payload stores (a store-forwarding
  // stall that was 12 % of the memif sender's time). After this frame's
  // payload, those stores are done. The payload is copied and summed in one
  // pass over the source (copy_partial_sum): the source is the part not in
  // cache, and the destination mbuf, recycled through the pool's per-core
  // cache, usually is.
  uint64_t payload_sum = 0;
  if constexpr (copy) {
    if (mode == ChecksumMode::kSoftware) {
      payload_sum = copy_partial_sum(data, payload.data(), payload.size());
    } else {
      copy_payload(data, payload.data(), payload.size());
    }
  } else if (mode == ChecksumMode::kSoftware) {
    payload_sum = partial_sum(payload.data(), payload.size());
  }
#if defined(__AVX512BW__)
  // One load, shuffle and store, and the header's sum from the register.
  const uint64_t header_sum = wire::encode_summed(h, payload_len, mh);
#else
  // Field by field from the caller's struct; payload_len is patched after.
  // The header's words are summed from the values: reading back what was
  // just stored would stall on store forwarding.
  wire::encode(h, mh);
  mh.payload_len.set(payload_len);
  const uint64_t header_sum =
      mode == ChecksumMode::kSoftware
          ? __builtin_bswap16(fold_sum(wire::header_word_sum(h) - h.payload_len + payload_len))
          : 0;
#endif

  uint64_t auth_sum = 0;
  if (auth != nullptr) {
    std::memcpy(p + FrameTemplate::kSize + wire::kHeaderSize, auth, wire::kAuthSize);
    if (mode == ChecksumMode::kSoftware) auth_sum = partial_sum(auth, wire::kAuthSize);
  }

  // Lengths enter the sums as big-endian 16-bit words, as on the wire.
  be16 ip_len_be(ip_len), udp_len_be(udp_len);
  uint16_t ip_len_word, udp_len_word;
  std::memcpy(&ip_len_word, &ip_len_be, 2);
  std::memcpy(&udp_len_word, &udp_len_be, 2);
  if (mode != ChecksumMode::kOffload) {
    store_checksum(ip.checksum, checksum_of(t.ip_sum + ip_len_word));
  }
  switch (mode) {
    case ChecksumMode::kSoftware: {
      // Pseudo-header length and UDP length field: the same word twice.
      uint16_t c = checksum_of(t.udp_sum + 2u * udp_len_word + header_sum + auth_sum + payload_sum);
      if (c == 0) c = 0xffff;  // 0 means "no checksum" in UDP; 0xffff is its twin
      store_checksum(udp.checksum, c);
      break;
    }
    case ChecksumMode::kOffload:
      // DPDK's offload wants the pseudo-header sum (addresses, protocol, length).
      store_checksum(udp.checksum, fold_sum(t.pseudo_sum + udp_len_word));
      break;
    case ChecksumMode::kNone:
      break;
  }
  if constexpr (!copy) {
    return kFrameOverhead + extra;
  } else {
    size_t len = kL2Len + ip_len;
    if (len < kMinFrame) {
      std::memset(p + len, 0, kMinFrame - len);
      len = kMinFrame;
    }
    return len;
  }
}

}  // namespace

size_t build_data_frame(std::span<std::byte> out, const FrameTemplate& t,
                        const wire::HeaderFields& h, std::span<const std::byte> payload,
                        ChecksumMode mode, const wire::AuthBlock* auth) {
  return build_data<true>(out, t, h, payload, mode, auth);
}

size_t build_data_headers(std::span<std::byte> out, const FrameTemplate& t,
                          const wire::HeaderFields& h, std::span<const std::byte> payload,
                          ChecksumMode mode, const wire::AuthBlock* auth) {
  return build_data<false>(out, t, h, payload, mode, auth);
}

size_t build_arp_frame(std::span<std::byte> out, uint16_t oper, const LocalAddr& local,
                       const MacAddr& target_mac, uint32_t target_ip) {
  std::byte* p = out.data();
  auto& eth = *reinterpret_cast<EtherHeader*>(p);
  eth.dst = oper == 1 ? MacAddr::broadcast().bytes : target_mac.bytes;
  eth.src = local.mac.bytes;
  eth.ether_type.set(kEtherTypeArp);
  auto& arp = *reinterpret_cast<ArpPacket*>(p + kL2Len);
  arp.htype.set(1);
  arp.ptype.set(kEtherTypeIpv4);
  arp.hlen = 6;
  arp.plen = 4;
  arp.oper.set(oper);
  arp.sha = local.mac.bytes;
  arp.spa.set(local.ip);
  arp.tha = oper == 1 ? std::array<uint8_t, 6>{} : target_mac.bytes;
  arp.tpa.set(target_ip);
  const size_t len = kL2Len + sizeof(ArpPacket);
  std::memset(p + len, 0, kMinFrame - len);
  return kMinFrame;
}

}  // namespace mercury::net
