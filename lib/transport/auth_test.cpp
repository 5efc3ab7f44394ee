// The authenticated data plane without EAL: the MAC itself (every byte it
// covers, the nonce's two node ids, the key), the replay window, and two
// Endpoints with a job key on a net::MemoryPort link under a fake clock:
// exact delivery under loss, duplication and reordering, and every forgery
// an attacker on the link could try refused and counted by its reason: a
// wrong key, no MAC, a replayed packet, a forged ACK announcing a restart, a
// recorded packet of an earlier incarnation, a peer without the key.
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>

#include <cstring>
#include <memory>
#include <vector>

#include "transport/endpoint_test_util.h"
#include "transport/recording_port.h"

namespace mercury::transport {
namespace {

using test::Inbox;
using test::kAddrA;
using test::kAddrB;
using test::Link;
using test::Log;
using test::pattern;
using test::peer_at;

SharedAuthKey key_of(uint8_t seed) {
  auto k = std::make_shared<AuthKey>();
  for (size_t i = 0; i < k->size(); ++i) (*k)[i] = static_cast<uint8_t>(seed * 37 + i);
  return k;
}

std::vector<std::byte> header_bytes(const wire::HeaderFields& h) {
  std::vector<std::byte> b(wire::kHeaderSize);
  wire::encode(h, std::span<std::byte, wire::kHeaderSize>(b.data(), wire::kHeaderSize));
  return b;
}

// ---------------------------------------------------------------------------
// The MAC.

TEST(Auth, SignedPacketVerifiesAndAnyChangeBreaksIt) {
  Authenticator signer(*key_of(1)), checker(*key_of(1));
  wire::HeaderFields h;
  h.type = wire::PacketType::kData;
  h.flags = wire::flags::kAuth;
  h.job_id = 7;
  h.sender_id = 3;
  h.msg_len = 1344;
  h.payload_len = 1344;
  h.seq = 12345;
  std::vector<std::byte> header = header_bytes(h);
  std::vector<std::byte> payload = pattern(9, 1344);
  wire::AuthBlock block{};
  signer.sign_st(3, 0, 1'000'000, header.data(), payload, block);
  EXPECT_EQ(block.counter.get(), 1'000'000u);
  EXPECT_TRUE(checker.verify_st(3, 0, header.data(), payload, block));

  // Every byte the MAC covers: header, payload, counter and the tag itself.
  for (size_t i = 0; i < header.size(); ++i) {
    header[i] ^= std::byte{0x01};
    EXPECT_FALSE(checker.verify_st(3, 0, header.data(), payload, block)) << "header byte " << i;
    header[i] ^= std::byte{0x01};
  }
  for (size_t i : {size_t{0}, size_t{700}, payload.size() - 1}) {
    payload[i] ^= std::byte{0x80};
    EXPECT_FALSE(checker.verify_st(3, 0, header.data(), payload, block)) << "payload byte " << i;
    payload[i] ^= std::byte{0x80};
  }
  wire::AuthBlock other = block;
  other.counter.set(1'000'001);
  EXPECT_FALSE(checker.verify_st(3, 0, header.data(), payload, other));
  other = block;
  other.tag[15] ^= 1;
  EXPECT_FALSE(checker.verify_st(3, 0, header.data(), payload, other));
  // A shorter payload (the same bytes cut) does not verify either.
  EXPECT_FALSE(checker.verify_st(3, 0, header.data(), std::span(payload).first(1280), block));
  // The nonce binds the pair of nodes: the packet is no good between others.
  EXPECT_FALSE(checker.verify_st(4, 0, header.data(), payload, block));
  EXPECT_FALSE(checker.verify_st(3, 1, header.data(), payload, block));
  // Another key.
  Authenticator stranger(*key_of(2));
  EXPECT_FALSE(stranger.verify_st(3, 0, header.data(), payload, block));
  // Still good after all of that: nothing above changed the checker's state.
  EXPECT_TRUE(checker.verify_st(3, 0, header.data(), payload, block));
}

// The tag is RFC 4543's AES-GMAC: what EVP's AES-256-GCM gives with the
// header, counter and payload as additional data, the nonce (sender,
// receiver, counter) as IV, under the MAC key HKDF-SHA256 derives.
TEST(Auth, TheTagIsEvpAes256GcmOverEverythingAsAdditionalData) {
  const SharedAuthKey key = key_of(3);
  unsigned char mac_key[32];
  {
    EVP_KDF* kdf = EVP_KDF_fetch(nullptr, "HKDF", nullptr);
    EVP_KDF_CTX* ctx = EVP_KDF_CTX_new(kdf);
    char digest[] = "SHA256", salt[] = "mercury", info[] = "mercury packet mac";
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string("digest", digest, 0),
        OSSL_PARAM_construct_octet_string("key", const_cast<uint8_t*>(key->data()), key->size()),
        OSSL_PARAM_construct_octet_string("salt", salt, sizeof salt - 1),
        OSSL_PARAM_construct_octet_string("info", info, sizeof info - 1),
        OSSL_PARAM_construct_end()};
    ASSERT_EQ(EVP_KDF_derive(ctx, mac_key, sizeof mac_key, params), 1);
    EVP_KDF_CTX_free(ctx);
    EVP_KDF_free(kdf);
  }
  Authenticator auth(*key);
  wire::HeaderFields h;
  h.flags = wire::flags::kAuth;
  h.sender_id = 0x0102;
  for (uint32_t len : {0u, 1u, 15u, 16u, 17u, 1344u, 8832u}) {
    h.payload_len = static_cast<uint16_t>(len);
    h.msg_len = len;
    const std::vector<std::byte> header = header_bytes(h);
    const std::vector<std::byte> payload = pattern(len, len);
    wire::AuthBlock block{};
    auth.sign_st(0x0102, 0x0304, 0x1122334455667788ull, header.data(), payload, block);
    unsigned char iv[12] = {0x01, 0x02, 0x03, 0x04, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88};
    std::vector<unsigned char> aad(header.size() + 8 + payload.size());
    std::memcpy(aad.data(), header.data(), header.size());
    std::memcpy(aad.data() + header.size(), &block.counter, 8);
    if (len != 0) std::memcpy(aad.data() + header.size() + 8, payload.data(), len);
    EVP_CIPHER_CTX* c = EVP_CIPHER_CTX_new();
    int out = 0;
    unsigned char want[16];
    ASSERT_EQ(EVP_EncryptInit_ex(c, EVP_aes_256_gcm(), nullptr, mac_key, iv), 1);
    ASSERT_EQ(EVP_EncryptUpdate(c, nullptr, &out, aad.data(), static_cast<int>(aad.size())), 1);
    ASSERT_EQ(EVP_EncryptFinal_ex(c, nullptr, &out), 1);
    ASSERT_EQ(EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, 16, want), 1);
    EVP_CIPHER_CTX_free(c);
    EXPECT_EQ(std::memcmp(block.tag, want, 16), 0) << len << " payload bytes";
  }
}

TEST(Auth, TagsDifferPerCounterAndPureAcksAreSignedToo) {
  Authenticator a(*key_of(1));
  wire::HeaderFields h;
  h.type = wire::PacketType::kAck;
  h.flags = wire::flags::kAuth | wire::flags::kAckValid;
  const std::vector<std::byte> header = header_bytes(h);
  wire::AuthBlock b1{}, b2{};
  a.sign_st(1, 2, 5, header.data(), {}, b1);
  a.sign_st(1, 2, 6, header.data(), {}, b2);
  EXPECT_NE(std::memcmp(b1.tag, b2.tag, sizeof b1.tag), 0);
  EXPECT_TRUE(a.verify_st(1, 2, header.data(), {}, b1));
  EXPECT_TRUE(a.verify_st(1, 2, header.data(), {}, b2));
}

TEST(Auth, SequenceSaltDependsOnTheKeyOnly) {
  EXPECT_EQ(derive_seq_salt(*key_of(1)), derive_seq_salt(*key_of(1)));
  EXPECT_NE(derive_seq_salt(*key_of(1)), derive_seq_salt(*key_of(2)));
}

TEST(Auth, CountersStartFromTheWallClockSoTheyGrowAcrossRestarts) {
  const uint64_t first = initial_auth_counter();
  const uint64_t second = initial_auth_counter();
  EXPECT_GT(first, uint64_t{1'700'000'000} * 1'000'000'000);  // after 2023, in nanoseconds
  EXPECT_GE(second, first);
}

// ---------------------------------------------------------------------------
// The replay window.

TEST(ReplayWindow, TakesEachCounterOnceWithinTheWindow) {
  ReplayWindow w;
  EXPECT_FALSE(w.take(0));  // 0 is never sent
  EXPECT_TRUE(w.take(1000));
  EXPECT_FALSE(w.take(1000));
  EXPECT_TRUE(w.take(1002));
  EXPECT_TRUE(w.take(1001));  // late, within the window: once
  EXPECT_FALSE(w.take(1001));
  EXPECT_EQ(w.top(), 1002u);
  EXPECT_TRUE(w.take(1002 - 63));   // the oldest the window holds
  EXPECT_FALSE(w.take(1002 - 64));  // older: refused as a replay
  EXPECT_TRUE(w.take(1002 + 64));   // a jump of a whole window forgets the rest
  EXPECT_FALSE(w.take(1002));
  EXPECT_TRUE(w.take(1002 + 63));
}

// ---------------------------------------------------------------------------
// Endpoints with a job key.

EndpointConfig keyed(uint32_t epoch, uint16_t sender_id, uint16_t peer_id, const PeerSpec& peer,
                     SharedAuthKey key) {
  EndpointConfig c = test::endpoint_config(epoch, sender_id, peer);
  c.peers[0].node_id = peer_id;
  c.auth_key = std::move(key);
  if (c.auth_key) c.transport.seq_salt = derive_seq_salt(*c.auth_key);
  return c;
}

std::vector<std::vector<std::byte>> bodies(uint32_t n, uint32_t len, uint32_t salt = 0) {
  std::vector<std::vector<std::byte>> v;
  for (uint32_t i = 0; i < n; ++i) v.push_back(pattern(i + salt, len + i * 1000));
  return v;
}

uint64_t drops(const Endpoint& e, EndpointDrop d) { return e.counters_st().drop(d); }

TEST(AuthEndpoint, ExactUnderLossDuplicationAndReorderingAndLinkDuplicatesAreReplays) {
  Link l;
  l.impair(0.02, 0.02, 0.02, 11);
  Inbox in_a, in_b;
  const SharedAuthKey key = key_of(1);
  Endpoint a(l.a, keyed(3, 0, 1, peer_at("b", kAddrB), key), in_a, l.now);
  Endpoint b(l.b, keyed(5, 1, 0, peer_at("a", kAddrA), key), in_b, l.now);
  EXPECT_EQ(a.max_payload(), net::payload_per_packet(test::kMtu, true));
  EXPECT_EQ(a.max_payload(), 1344u);
  const auto to_b = bodies(12, 50'000), to_a = bodies(5, 3'000, 100);
  Log log_a, log_b;
  test::send_all(a, to_b, log_a);
  test::send_all(b, to_a, log_b);
  ASSERT_TRUE(l.run(
      {&a, &b}, [&] { return log_a.ok.size() == to_b.size() && log_b.ok.size() == to_a.size(); }));
  l.idle({&a, &b}, 10 * test::kMs);
  EXPECT_TRUE(log_a.all_ok(to_b.size()));
  EXPECT_TRUE(log_b.all_ok(to_a.size()));
  for (uint32_t i = 0; i < to_b.size(); ++i) EXPECT_TRUE(in_b.has(i, to_b[i])) << "message " << i;
  for (uint32_t i = 0; i < to_a.size(); ++i) EXPECT_TRUE(in_a.has(i, to_a[i])) << "message " << i;
  // The link's duplicates carry a counter taken already: refused as replays
  // before the transport sees them, each one (none is lost after
  // duplication here, so the counts match exactly).
  const uint64_t dup_to_b = l.a.counters().link_duplicated,
                 dup_to_a = l.b.counters().link_duplicated;
  EXPECT_GT(dup_to_b, 0u);
  EXPECT_EQ(drops(b, EndpointDrop::kAuthReplay), dup_to_b);
  EXPECT_EQ(drops(a, EndpointDrop::kAuthReplay), dup_to_a);
  for (const Endpoint* e : {&a, &b}) {
    EXPECT_EQ(drops(*e, EndpointDrop::kAuthBadMac), 0u);
    EXPECT_EQ(drops(*e, EndpointDrop::kAuthMissing), 0u);
  }
}

TEST(AuthEndpoint, ForgeriesAreRefusedAndCountedAndTheStreamGoesOn) {
  Link l;
  Inbox in_a, in_b;
  const SharedAuthKey key = key_of(1);
  test::RecordingPort rec_b(l.b);
  Endpoint a(l.a, keyed(3, 0, 1, peer_at("b", kAddrB), key), in_a, l.now);
  Endpoint b(rec_b, keyed(5, 1, 0, peer_at("a", kAddrA), key), in_b, l.now);
  const auto first = bodies(3, 4'000);
  Log log;
  test::send_all(a, first, log);
  ASSERT_TRUE(l.run({&a, &b}, [&] { return log.ok.size() == first.size(); }));
  const std::vector<std::byte> genuine = rec_b.first_data();
  const net::FrameTemplate route_ab =
      net::make_frame_template(kAddrA, net::Route{kAddrB.mac, kAddrB.ip, kAddrB.udp_port});

  // 1. A replay of a genuine packet, byte for byte.
  ASSERT_TRUE(l.b.inject_st(genuine));
  // 2. The same packet with one payload byte changed (the UDP checksum
  //    recomputed, as an attacker would): the MAC fails.
  {
    wire::HeaderFields h;
    ASSERT_EQ(wire::decode(std::span(genuine).subspan(net::FrameTemplate::kSize), h),
              wire::Reject::kNone);
    const size_t at = net::FrameTemplate::kSize + wire::kHeaderSize;
    wire::AuthBlock block;
    std::memcpy(&block, genuine.data() + at, sizeof block);
    std::vector<std::byte> payload(genuine.begin() + at + wire::kAuthSize, genuine.end());
    payload[10] ^= std::byte{1};
    std::vector<std::byte> frame(genuine.size() + 64);
    const size_t len =
        net::build_data_frame(frame, route_ab, h, payload, net::ChecksumMode::kSoftware, &block);
    frame.resize(len);
    ASSERT_TRUE(l.b.inject_st(frame));
  }
  // 3. A forged pure ACK announcing a restart of a (epoch + 1), which before
  //    authentication reset the stream: signed with another key.
  // 4. The same without a MAC at all.
  {
    Authenticator stranger(*key_of(2));
    wire::HeaderFields h;
    h.type = wire::PacketType::kAck;
    h.flags = wire::flags::kAuth | wire::flags::kAckValid;
    h.sender_id = 0;
    h.epoch = 4;
    const std::vector<std::byte> hb = header_bytes(h);
    wire::AuthBlock block{};
    stranger.sign_st(0, 1, initial_auth_counter(), hb.data(), {}, block);
    std::vector<std::byte> frame(256);
    frame.resize(
        net::build_data_frame(frame, route_ab, h, {}, net::ChecksumMode::kSoftware, &block));
    ASSERT_TRUE(l.b.inject_st(frame));
    h.flags = wire::flags::kAckValid;
    frame.assign(256, std::byte{0});
    frame.resize(net::build_data_frame(frame, route_ab, h, {}, net::ChecksumMode::kSoftware));
    ASSERT_TRUE(l.b.inject_st(frame));
  }
  l.idle({&a, &b}, test::kMs);
  EXPECT_EQ(drops(b, EndpointDrop::kAuthReplay), 1u);
  EXPECT_EQ(drops(b, EndpointDrop::kAuthBadMac), 2u);
  EXPECT_EQ(drops(b, EndpointDrop::kAuthMissing), 1u);
  EXPECT_EQ(b.peer_stats_st(0).transport.rx.peer_restarts, 0u);
  EXPECT_EQ(b.counters_st().messages_received, first.size());

  // The stream goes on, exact.
  const auto more = bodies(3, 9'000, 50);
  Log log2;
  test::send_all(a, more, log2, wire::PacketType::kData, 100);
  ASSERT_TRUE(l.run({&a, &b}, [&] { return log2.ok.size() == more.size(); }));
  EXPECT_TRUE(log2.all_ok(more.size()));
  for (uint32_t i = 0; i < more.size(); ++i) EXPECT_TRUE(in_b.has(100 + i, more[i]));
}

TEST(AuthEndpoint, AnAuthenticRestartIsTakenAndTheOldIncarnationsPacketsAreNot) {
  Link l;
  Inbox in_a, in_b;
  const SharedAuthKey key = key_of(1);
  test::RecordingPort rec_b(l.b);
  Endpoint b(rec_b, keyed(5, 1, 0, peer_at("a", kAddrA), key), in_b, l.now);
  std::vector<std::byte> old_packet;
  {
    auto a1 =
        std::make_unique<Endpoint>(l.a, keyed(3, 0, 1, peer_at("b", kAddrB), key), in_a, l.now);
    const auto msgs = bodies(2, 5'000);
    Log log;
    test::send_all(*a1, msgs, log);
    ASSERT_TRUE(l.run({a1.get(), &b}, [&] { return log.ok.size() == msgs.size(); }));
    old_packet = rec_b.first_data();
  }
  // a restarts: a new incarnation (epoch 4), whose counters start later.
  Endpoint a2(l.a, keyed(4, 0, 1, peer_at("b", kAddrB), key), in_a, l.now);
  const auto again = bodies(2, 6'000, 30);
  Log log2;
  test::send_all(a2, again, log2, wire::PacketType::kData, 200);
  ASSERT_TRUE(l.run({&a2, &b}, [&] { return log2.ok.size() == again.size(); }));
  EXPECT_TRUE(log2.all_ok(again.size()));
  EXPECT_EQ(b.peer_stats_st(0).transport.rx.peer_restarts, 1u);
  // A recording of the first incarnation, replayed: authentic but old.
  ASSERT_TRUE(l.b.inject_st(old_packet));
  l.idle({&a2, &b}, test::kMs);
  EXPECT_EQ(drops(b, EndpointDrop::kAuthReplay), 1u);
  EXPECT_EQ(b.peer_stats_st(0).transport.rx.peer_restarts, 1u);
  EXPECT_EQ(b.peer_stats_st(0).transport.rx.stale_epoch, 0u);  // refused before the transport
}

TEST(AuthEndpoint, APeerWithoutTheKeyGetsNothingThroughEitherWay) {
  Link l;
  Inbox in_a, in_b;
  Endpoint a(l.a, keyed(3, 0, 1, peer_at("b", kAddrB), key_of(1)), in_a, l.now);
  Endpoint b(l.b, keyed(5, 1, 0, peer_at("a", kAddrA), nullptr), in_b, l.now);
  const auto msgs = bodies(1, 2'000);
  Log log;
  test::send_all(a, msgs, log);
  l.idle({&a, &b}, 20 * test::kMs);
  EXPECT_EQ(log.ok.size(), 0u);
  EXPECT_EQ(b.counters_st().messages_received, 0u);
  EXPECT_GT(drops(b, EndpointDrop::kAuthUnexpected), 0u);  // a's probes, signed
  EXPECT_GT(drops(a, EndpointDrop::kAuthMissing), 0u);     // b's probes, unsigned
  EXPECT_EQ(a.counters_st().verdicts[static_cast<size_t>(RxVerdict::kNew)], 0u);
}

}  // namespace
}  // namespace mercury::transport
