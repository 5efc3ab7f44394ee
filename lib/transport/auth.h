// The authenticated data plane: a MAC on every packet under the job's key,
// and the replay window that takes each packet counter once.
//
// What it is for. On a network the job does not own, a peer's address and
// the job id in a header prove nothing: anyone who can send to a port can
// forge a gradient, an ACK or a restart. With a job key (network.auth_key_file),
// every packet carries a wire::AuthBlock: the sender's packet counter towards
// its receiver and an AES-256-GMAC tag (RFC 4543: AES-GCM with everything as
// additional data, Intel's ipsec-mb) over the Mercury header, the counter
// and the payload. The receiver verifies the tag before anything of the
// packet is believed, then takes the counter once in a sliding window. The
// counter starts at the sender's wall clock in nanoseconds, so a restarted
// sender's counters are above everything its earlier incarnation sent: a
// recorded packet of the old incarnation, replayed, is refused as old, and
// an epoch change (a restart) is believed only from a fresh, authentic packet.
// docs/security.md gives the threat model and the decisions.
//
// Keys. The key file holds 32 random bytes as 64 hex digits (`openssl rand
// -hex 32`; config::read_auth_key). Two keys are derived
// from it with HKDF-SHA256: the MAC key and the job's sequence salt
// (transport::Config::seq_salt), so initial sequence numbers are unknown to
// anyone without the key. The nonce of each MAC is (sender id, receiver id,
// counter), unique per key as long as each node's counter only grows.
//
// Threads and costs. An Authenticator belongs to one core (an endpoint's net
// core); sign_st/verify_st do not allocate, throw, lock or log. Each costs
// one AES block and a GHASH pass over header, counter and payload: about
// 45 ns for a pure ACK and 95 ns for a full 1500-byte packet here
// (benchmarks/transport_pmd/README.md, "Authentication").
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "base/owner.h"
#include "wire/header.h"

struct IMB_MGR;  // intel-ipsec-mb.h

namespace mercury::transport {

inline constexpr size_t kAuthKeyBytes = 32;

/// A job key (config::NetworkConfig::auth_key reads it from the key file
/// and wipes it when the last reference goes).
using AuthKey = std::array<uint8_t, kAuthKeyBytes>;
using SharedAuthKey = std::shared_ptr<const AuthKey>;

/// The job's sequence salt under `key` (HKDF-SHA256, info "mercury seq salt"):
/// every node of the job derives the same. Throws std::runtime_error if
/// libcrypto fails.
uint32_t derive_seq_salt(const AuthKey& key);

/// Signs and verifies packets under one job key. Control path: the
/// constructor derives the MAC key and expands it (throws
/// std::runtime_error if libcrypto or ipsec-mb fails). Datapath: the _st
/// methods.
class Authenticator {
 public:
  explicit Authenticator(const AuthKey& key);
  ~Authenticator();
  Authenticator(const Authenticator&) = delete;
  /// The endpoint's net core changed (Endpoint::hand_over).
  void hand_over() { owner_.hand_over(); }
  Authenticator& operator=(const Authenticator&) = delete;

  /// The tag for a packet from node `sender` to node `receiver` with
  /// `counter`: over `header` (the kHeaderSize bytes as they go on the wire,
  /// kAuth set), the counter as 8 big-endian bytes, then `payload`. Writes
  /// block.counter and block.tag.
  void sign_st(uint16_t sender, uint16_t receiver, uint64_t counter, const std::byte* header,
               std::span<const std::byte> payload, wire::AuthBlock& block);
  /// True if `block.tag` is the tag of that packet.
  bool verify_st(uint16_t sender, uint16_t receiver, const std::byte* header,
                 std::span<const std::byte> payload, const wire::AuthBlock& block);

 private:
  struct Keys;
  void tag_st(uint16_t sender, uint16_t receiver, const wire::AuthBlock& counter,
              const std::byte* header, std::span<const std::byte> payload, unsigned char* tag);
  struct FreeMgr {
    void operator()(IMB_MGR* m) const;
  };
  std::unique_ptr<IMB_MGR, FreeMgr> mgr_;  // ipsec-mb's functions for this CPU
  std::unique_ptr<Keys> keys_;             // the expanded MAC key
  base::Owner owner_;                      // the endpoint's net core
};

/// The counters one receiver has taken from one sender: the highest, and a
/// bitmap of the 64 below it (RFC 4303's anti-replay window). A counter is
/// taken once; one more than 63 below the highest is refused as old.
class ReplayWindow {
 public:
  static constexpr uint64_t kWidth = 64;
  /// Would take `counter` (check first, commit after the MAC verified:
  /// both are one call here because the MAC is verified before).
  bool take(uint64_t counter) {
    if (counter > top_) {
      const uint64_t shift = counter - top_;
      seen_ = shift >= kWidth ? 0 : seen_ << shift;
      seen_ |= 1;  // bit 0 is top itself
      top_ = counter;
      return true;
    }
    const uint64_t back = top_ - counter;
    if (back >= kWidth || top_ == 0) return false;  // too old (or 0, never sent)
    const uint64_t bit = uint64_t{1} << back;
    if ((seen_ & bit) != 0) return false;
    seen_ |= bit;
    return true;
  }
  [[nodiscard]] uint64_t top() const { return top_; }

 private:
  uint64_t top_ = 0;
  uint64_t seen_ = 0;
};

/// Where a node's packet counters start: the wall clock in nanoseconds, so
/// that they grow across its restarts (a node sends far fewer than one
/// packet per nanosecond).
uint64_t initial_auth_counter();

}  // namespace mercury::transport
