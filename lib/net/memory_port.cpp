#include "net/memory_port.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "net/checksum.h"

namespace mercury::net {

namespace {

constexpr size_t kAlign = 64;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

MemoryPort::MemoryPort(const LocalAddr& local, const MemoryPortOptions& options)
    : local_(local),
      mtu_(options.mtu),
      tx_mode_(options.udp_checksum ? ChecksumMode::kSoftware : ChecksumMode::kNone),
      verify_udp_(options.udp_checksum),
      tx_by_reference_(options.tx_by_reference) {
  if (options.mtu < 576 || options.mtu > kMaxMtu) {
    throw std::invalid_argument("memory port: mtu must be 576.." + std::to_string(kMaxMtu));
  }
  if (options.buffers == 0) throw std::invalid_argument("memory port: buffers must be >= 1");
  // A data frame is at most the IP MTU plus the Ethernet header.
  frame_capacity_ =
      static_cast<uint32_t>(round_up(std::max<size_t>(mtu_ + kL2Len, kMinFrame), kAlign));
  memory_.resize(size_t{options.buffers} * frame_capacity_ + kAlign);
  auto* base = memory_.data();
  base += (kAlign - reinterpret_cast<uintptr_t>(base) % kAlign) % kAlign;
  buffers_.resize(options.buffers);
  free_.reserve(options.buffers);
  for (uint32_t i = 0; i < options.buffers; ++i) {
    buffers_[i] = Buffer{this, base + size_t{i} * frame_capacity_, 0, 0, nullptr, 0};
    free_.push_back(&buffers_[i]);
  }
  rx_.resize(options.buffers);
  set_link(MemoryLinkParams{});
}

MemoryPort::~MemoryPort() {
  // Frames queued here go back to their owners; ours still on the link (at
  // the peer, in its queue) are taken out of it.
  while (rx_count_ > 0) {
    give_back(rx_[rx_head_]);
    rx_head_ = (rx_head_ + 1) % rx_.size();
    --rx_count_;
  }
  if (peer_ != nullptr) {
    MemoryPort& p = *peer_;
    size_t kept = 0;
    for (size_t i = 0; i < p.rx_count_; ++i) {
      Buffer* b = p.rx_[(p.rx_head_ + i) % p.rx_.size()];
      if (b->owner != this) p.rx_[(p.rx_head_ + kept++) % p.rx_.size()] = b;
    }
    p.rx_count_ = kept;
    p.peer_ = nullptr;
  }
}

void MemoryPort::connect(MemoryPort& a, MemoryPort& b) {
  a.peer_ = &b;
  b.peer_ = &a;
}

void MemoryPort::set_link(const MemoryLinkParams& params) {
  link_ = params;
  rng_ = params.seed * 0x9E3779B97F4A7C15ull | 1;
}

bool MemoryPort::draw(double p) {
  if (p <= 0) return false;
  // xorshift64*: the same draws from the same seed on every machine.
  rng_ ^= rng_ >> 12;
  rng_ ^= rng_ << 25;
  rng_ ^= rng_ >> 27;
  const uint64_t u = rng_ * 0x2545F4914F6CDD1Dull;
  return static_cast<double>(u >> 11) * 0x1.0p-53 < p;
}

MemoryPort::Buffer* MemoryPort::take_buffer() {
  if (free_.empty()) return nullptr;
  Buffer* b = free_.back();
  free_.pop_back();
  return b;
}

uint16_t MemoryPort::stage_burst_st(const TxFrame* frames, uint16_t n) {
  MERCURY_OWNED(owner_);
  uint16_t staged = 0;
  FrameTemplate made;  // for a route without one (resolve_st always gives one)
  for (uint16_t i = 0; i < n; ++i) {
    if (staged_ == kStage) {
      ++counters_.tx_stage_full;
      continue;
    }
    Buffer* b = take_buffer();
    if (b == nullptr) {
      ++counters_.tx_no_buffer;
      continue;
    }
    const TxFrame& f = frames[i];
    const std::span<std::byte> room{b->data, frame_capacity_};
    const std::span<const std::byte> payload{f.payload, f.header.payload_len};
    const FrameTemplate* t = &f.route->frame;
    if (!t->valid) {
      made = make_frame_template(local_, *f.route);
      t = &made;
    }
    if (tx_by_reference_ && !payload.empty()) {
      // The headers now; the payload when the receiver takes the frame.
      b->len = static_cast<uint32_t>(
          build_data_headers(room, *t, f.header, payload, tx_mode_, f.auth_block()));
      b->ref = payload.data();
      b->ref_len = static_cast<uint32_t>(payload.size());
    } else {
      b->len = static_cast<uint32_t>(
          build_data_frame(room, *t, f.header, payload, tx_mode_, f.auth_block()));
      b->ref = nullptr;
    }
    stage_[staged_++] = b;
    ++staged;
  }
  return staged;
}

uint16_t MemoryPort::flush_st(uint64_t) {
  MERCURY_OWNED(owner_);
  // A frame held back for reordering waits for the next frame, or for one
  // flush at most.
  if (staged_ == 0 && held_ != nullptr) {
    Buffer* b = held_;
    held_ = nullptr;
    if (peer_ != nullptr && !link_.cut) {
      peer_->deliver(b);
    } else {
      ++counters_.link_lost;
      give_back(b);
    }
  }
  const uint16_t sent = staged_;
  for (uint16_t i = 0; i < sent; ++i) transmit(stage_[i]);
  staged_ = 0;
  counters_.tx_frames += sent;
  return sent;
}

bool MemoryPort::filtered(const Buffer* b) const {
  if (link_.drop_if == nullptr) return false;
  wire::HeaderFields h;
  constexpr size_t kAt = kL2Len + kL3Len + kL4Len;
  // A frame sent by reference has its headers only: decode reads no further.
  if (wire::decode({b->data + kAt, b->len + b->ref_len * (b->ref != nullptr) - kAt}, h) !=
      wire::Reject::kNone) {
    return false;
  }
  return link_.drop_if(link_.drop_context, h);
}

void MemoryPort::transmit(Buffer* b) {
  if (peer_ == nullptr || link_.cut || filtered(b) || draw(link_.loss)) {
    ++counters_.link_lost;
    give_back(b);
    return;
  }
  Buffer* dup = nullptr;
  if (draw(link_.duplicate) && (dup = take_buffer()) != nullptr) {
    std::memcpy(dup->data, b->data, b->len);
    dup->len = b->len;
    dup->ref = b->ref;
    dup->ref_len = b->ref_len;
    ++counters_.link_duplicated;
  }
  if (held_ == nullptr && draw(link_.reorder)) {
    held_ = b;
    ++counters_.link_reordered;
  } else {
    peer_->deliver(b);
    if (held_ != nullptr) {
      peer_->deliver(held_);
      held_ = nullptr;
    }
  }
  if (dup != nullptr) peer_->deliver(dup);
}

bool MemoryPort::deliver(Buffer* b) {
  if (rx_count_ == rx_.size()) {
    ++counters_.rx_overflow;
    give_back(b);
    return false;
  }
  rx_[(rx_head_ + rx_count_) % rx_.size()] = b;
  ++rx_count_;
  return true;
}

uint16_t MemoryPort::poll_rx_st(RxPacket* out, uint16_t n, uint64_t) {
  MERCURY_OWNED(owner_);
  if (n > kBurst) n = kBurst;
  uint16_t kept = 0;
  while (kept < n && rx_count_ > 0) {
    Buffer* b = rx_[rx_head_];
    rx_head_ = (rx_head_ + 1) % rx_.size();
    --rx_count_;
    ++counters_.rx_frames;
    if (b->ref != nullptr) {
      // Sent by reference: the payload comes in now, on this port's CPU, as
      // a NIC's DMA would have written it.
      copy_payload(b->data + b->len, b->ref, b->ref_len);
      b->len += b->ref_len;
      b->ref = nullptr;
      ++counters_.rx_copied_in;
    }
    ParsedFrame& f = out[kept].parsed;
    parse_frame({b->data, b->len}, local_, RxChecks{.verify_udp_checksum = verify_udp_}, f);
    switch (f.kind) {
      case FrameKind::kMercury:
        out[kept++].buf = reinterpret_cast<PacketBuf*>(b);
        break;
      case FrameKind::kArp:
        ++counters_.rx_arp;  // routes resolve without ARP here
        give_back(b);
        break;
      case FrameKind::kDrop:
        ++counters_.drops[static_cast<size_t>(f.drop)];
        give_back(b);
        break;
    }
  }
  counters_.rx_mercury += kept;
  return kept;
}

void MemoryPort::release_st(PacketBuf* const* bufs, uint16_t n) {
  MERCURY_OWNED(owner_);
  for (uint16_t i = 0; i < n; ++i) give_back(reinterpret_cast<Buffer*>(bufs[i]));
}

const BufferOps MemoryPort::kBufferOps{
    [](PacketBuf* b) { give_back(reinterpret_cast<Buffer*>(b)); },
    [](const PacketBuf* b) { return reinterpret_cast<const Buffer*>(b)->mark; },
    [](PacketBuf* b, uint16_t mark) { reinterpret_cast<Buffer*>(b)->mark = mark; },
    [](const PacketBuf* b) -> const std::byte* { return reinterpret_cast<const Buffer*>(b)->data; },
    [](const PacketBuf* b) {
      const MemoryPort* owner = reinterpret_cast<const Buffer*>(b)->owner;
      return PoolFacts{.id = owner, .size = owner->buffers(), .cache_size = 0, .cache_lcores = 0};
    }};

const BufferOps& MemoryPort::buffer_ops() const { return kBufferOps; }

std::string MemoryPort::name() const { return "memory port " + ipv4_to_string(local_.ip); }

bool MemoryPort::resolve_st(uint32_t ip, uint16_t udp_port, Route& out, uint64_t) {
  MERCURY_OWNED(owner_);
  if (peer_ == nullptr || ip != peer_->local_.ip) {
    ++counters_.resolve_failed;
    return false;
  }
  out = Route{peer_->local_.mac, ip, udp_port};
  out.frame = make_frame_template(local_, out);
  return true;
}

bool MemoryPort::inject_st(std::span<const std::byte> frame) {
  MERCURY_OWNED(owner_);
  if (frame.size() > frame_capacity_) return false;
  Buffer* b = take_buffer();
  if (b == nullptr) return false;
  std::memcpy(b->data, frame.data(), frame.size());
  b->len = static_cast<uint32_t>(frame.size());
  b->ref = nullptr;
  return deliver(b);
}

}  // namespace mercury::net
