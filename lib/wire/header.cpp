#include "wire/header.h"

namespace mercury::wire {

std::string_view reject_name(Reject r) {
  switch (r) {
    case Reject::kNone:
      return "none";
    case Reject::kTruncated:
      return "truncated";
    case Reject::kBadVersion:
      return "bad_version";
    case Reject::kBadType:
      return "bad_type";
    case Reject::kBadFlags:
      return "bad_flags";
    case Reject::kBadDtype:
      return "bad_dtype";
    case Reject::kPayloadMismatch:
      return "payload_mismatch";
    case Reject::kAckWithPayload:
      return "ack_with_payload";
    case Reject::kStartWithPayload:
      return "start_with_payload";
    case Reject::kBadRange:
      return "bad_range";
    case Reject::kBadAlignment:
      return "bad_alignment";
    case Reject::kCount:
      break;
  }
  return "unknown";
}

void encode(const HeaderFields& f, Header& h) {
  h.version = kVersion;
  h.type = static_cast<uint8_t>(f.type);
  h.flags.set(f.flags);
  h.job_id.set(f.job_id);
  h.sender_id.set(f.sender_id);
  h.priority = f.priority;
  h.dtype = static_cast<uint8_t>(f.dtype);
  h.block_key.set(f.block_key);
  h.msg_id.set(f.msg_id);
  h.msg_len.set(f.msg_len);
  h.offset.set(f.offset);
  h.iteration.set(f.iteration);
  h.param_version.set(f.param_version);
  h.seq.set(f.seq);
  h.ack.set(f.ack);
  h.payload_len.set(f.payload_len);
  h.credit.set(f.credit);
  h.sack.set(f.sack);
  h.epoch.set(f.epoch);
  h.reserved32.set(0);
}

void encode(const HeaderFields& f, std::span<std::byte, kHeaderSize> out) {
  encode(f, *reinterpret_cast<Header*>(out.data()));
}

uint64_t header_word_sum(const HeaderFields& f) {
  auto w32 = [](uint32_t v) -> uint64_t { return (v >> 16) + (v & 0xffffu); };
  auto w64 = [&](uint64_t v) -> uint64_t {
    return w32(static_cast<uint32_t>(v >> 32)) + w32(static_cast<uint32_t>(v));
  };
  return (uint64_t{kVersion} << 8 | static_cast<uint8_t>(f.type)) + f.flags + w32(f.job_id) +
         f.sender_id + (uint64_t{f.priority} << 8 | static_cast<uint8_t>(f.dtype)) +
         w32(f.block_key) + w32(f.msg_id) + w32(f.msg_len) + w32(f.offset) + w32(f.iteration) +
         w32(f.param_version) + w32(f.seq) + w32(f.ack) + f.payload_len + f.credit + w64(f.sack) +
         w32(f.epoch);
}

Reject decode(std::span<const std::byte> packet, HeaderFields& f) {
  if (packet.size() < kHeaderSize) return Reject::kTruncated;
  const auto& h = *reinterpret_cast<const Header*>(packet.data());
  if (h.version != kVersion) return Reject::kBadVersion;
  if (h.type < static_cast<uint8_t>(PacketType::kData) ||
      h.type > static_cast<uint8_t>(PacketType::kPartitionStart)) {
    return Reject::kBadType;
  }
  f.type = static_cast<PacketType>(h.type);
  f.flags = h.flags.get();
  if ((f.flags & ~flags::kKnown) != 0) return Reject::kBadFlags;
  if (h.dtype >= kDtypeCount) return Reject::kBadDtype;
  f.dtype = static_cast<Dtype>(h.dtype);
  f.payload_len = h.payload_len.get();
  // An authenticated packet has its AuthBlock between header and payload.
  const size_t extra = (f.flags & flags::kAuth) != 0 ? kAuthSize : 0;
  if (packet.size() < kHeaderSize + extra || f.payload_len != packet.size() - kHeaderSize - extra) {
    return Reject::kPayloadMismatch;
  }
  f.job_id = h.job_id.get();
  f.sender_id = h.sender_id.get();
  f.priority = h.priority;
  f.block_key = h.block_key.get();
  f.msg_id = h.msg_id.get();
  f.msg_len = h.msg_len.get();
  f.offset = h.offset.get();
  f.iteration = h.iteration.get();
  f.param_version = h.param_version.get();
  f.seq = h.seq.get();
  f.ack = h.ack.get();
  f.credit = h.credit.get();
  f.sack = h.sack.get();
  f.epoch = h.epoch.get();
  f.reserved32 = 0;  // ignored: a later version may use it
  if (f.type == PacketType::kAck) {
    if (f.payload_len != 0) return Reject::kAckWithPayload;
  } else {
    if (f.type == PacketType::kPartitionStart && f.payload_len != 0) {
      return Reject::kStartWithPayload;
    }
    // 64-bit sum: offset + payload_len cannot wrap.
    if (uint64_t{f.offset} + f.payload_len > f.msg_len) return Reject::kBadRange;
    // An element never straddles two packets: element sizes are powers of two.
    if (((f.offset | f.payload_len | f.msg_len) & (element_bytes(f.dtype) - 1)) != 0) {
      return Reject::kBadAlignment;
    }
  }
  return Reject::kNone;
}

}  // namespace mercury::wire
