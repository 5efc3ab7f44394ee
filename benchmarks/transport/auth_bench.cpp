// The per-packet cost of the authenticated data plane's MAC (transport/auth.h)
// against the GHASH pass over the same bytes, measured in the same run.
//
//   mac/ghash/<payload>        ipsec-mb's GHASH alone over the bytes a tag
//                              covers (64-byte header, 8-byte counter,
//                              payload), in one contiguous call: a lower bound
//                              for any GMAC of them on this CPU. The limit.
//   mac/sign/<payload>         Authenticator::sign_st: the AES-256-GMAC the
//                              sender computes (one AES block for the nonce,
//                              GHASH over header, counter and payload).
//   mac/verify/<payload>       Authenticator::verify_st: the same and the
//                              constant-time compare of the receiver.
//   mac/openssl_gcm/<payload>  the same tag with OpenSSL 3.0's GCM mode
//                              (<openssl/modes.h>, CLMUL GHASH) over an EVP
//                              AES-256-ECB block function: the peer library's
//                              fastest way to it here.
//
// <payload> is 0 (a pure ACK), 1344 (a full packet at MTU 1500 with a key)
// or 8832 (at 9000). The counter is "pps", tags per second of CPU time; the
// ratio table divides each by mac/ghash of the same repetition. Run:
//   auth_bench --benchmark_repetitions=7 --benchmark_enable_random_interleaving=true
//              --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>
#include <intel-ipsec-mb.h>
#include <openssl/evp.h>
#include <openssl/modes.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "ratio_reporter.h"
#include "transport/auth.h"
#include "wire/header.h"

namespace mercury::transport::bench {
namespace {

constexpr size_t kCovered = wire::kHeaderSize + 8;  // header and counter before the payload

AuthKey bench_key() {
  AuthKey k;
  for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<uint8_t>(0xa5 ^ (i * 13));
  return k;
}

// A frame's bytes as the receiver sees them: header, auth block, payload.
struct Packet {
  explicit Packet(size_t payload) : bytes(wire::kHeaderSize + wire::kAuthSize + payload) {
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(i * 31 + 7);
  }
  const std::byte* header() const { return bytes.data(); }
  std::span<const std::byte> payload() const {
    return {bytes.data() + wire::kHeaderSize + wire::kAuthSize,
            bytes.size() - wire::kHeaderSize - wire::kAuthSize};
  }
  std::vector<std::byte> bytes;
};

void finish(benchmark::State& state) {
  state.counters["pps"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

void ghash(benchmark::State& state) {
  const auto payload = static_cast<size_t>(state.range(0));
  IMB_MGR* mgr = alloc_mb_mgr(0);
  if (mgr == nullptr) throw std::runtime_error("ipsec-mb: no manager");
  init_mb_mgr_auto(mgr, nullptr);
  const AuthKey key = bench_key();
  alignas(64) gcm_key_data keys;
  IMB_AES256_GCM_PRE(mgr, key.data(), &keys);
  std::vector<uint8_t> covered(kCovered + payload, 0x3c);
  std::array<uint8_t, 16> tag{};
  for (auto _ : state) {
    IMB_GHASH(mgr, &keys, covered.data(), covered.size(), tag.data(), tag.size());
    benchmark::DoNotOptimize(tag);
  }
  free_mb_mgr(mgr);
  finish(state);
}

void sign(benchmark::State& state) {
  Authenticator auth(bench_key());
  const Packet p(static_cast<size_t>(state.range(0)));
  wire::AuthBlock block{};
  uint64_t counter = 1;
  for (auto _ : state) {
    auth.sign_st(1, 2, counter++, p.header(), p.payload(), block);
    benchmark::DoNotOptimize(block);
  }
  finish(state);
}

void verify(benchmark::State& state) {
  Authenticator auth(bench_key());
  const Packet p(static_cast<size_t>(state.range(0)));
  wire::AuthBlock block{};
  auth.sign_st(1, 2, 1, p.header(), p.payload(), block);
  for (auto _ : state) {
    if (!auth.verify_st(1, 2, p.header(), p.payload(), block)) {
      state.SkipWithError("a genuine tag did not verify");
      break;
    }
  }
  finish(state);
}

void aes_block(const unsigned char in[16], unsigned char out[16], const void* ecb) {
  int len = 0;
  EVP_EncryptUpdate(static_cast<EVP_CIPHER_CTX*>(const_cast<void*>(ecb)), out, &len, in, 16);
}

void openssl_gcm(benchmark::State& state) {
  const auto payload = static_cast<size_t>(state.range(0));
  const AuthKey key = bench_key();
  EVP_CIPHER_CTX* ecb = EVP_CIPHER_CTX_new();
  if (ecb == nullptr ||
      EVP_EncryptInit_ex(ecb, EVP_aes_256_ecb(), nullptr, key.data(), nullptr) != 1 ||
      EVP_CIPHER_CTX_set_padding(ecb, 0) != 1) {
    throw std::runtime_error("libcrypto: cannot set up AES-256");
  }
  GCM128_CONTEXT* gcm = CRYPTO_gcm128_new(ecb, &aes_block);
  if (gcm == nullptr) throw std::runtime_error("libcrypto: cannot set up GCM");
  const Packet p(payload);
  const auto* bytes = reinterpret_cast<const unsigned char*>(p.bytes.data());
  std::array<unsigned char, 12> iv{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  std::array<unsigned char, 16> tag{};
  for (auto _ : state) {
    ++iv[11];
    CRYPTO_gcm128_setiv(gcm, iv.data(), iv.size());
    CRYPTO_gcm128_aad(gcm, bytes, kCovered);  // header and counter
    if (payload != 0) {
      CRYPTO_gcm128_aad(gcm, bytes + wire::kHeaderSize + wire::kAuthSize, payload);
    }
    CRYPTO_gcm128_tag(gcm, tag.data(), tag.size());
    benchmark::DoNotOptimize(tag);
  }
  CRYPTO_gcm128_release(gcm);
  EVP_CIPHER_CTX_free(ecb);
  finish(state);
}

BENCHMARK(ghash)->Name("mac/ghash")->Arg(0)->Arg(1344)->Arg(8832);
BENCHMARK(sign)->Name("mac/sign")->Arg(0)->Arg(1344)->Arg(8832);
BENCHMARK(verify)->Name("mac/verify")->Arg(0)->Arg(1344)->Arg(8832);
BENCHMARK(openssl_gcm)->Name("mac/openssl_gcm")->Arg(0)->Arg(1344)->Arg(8832);

}  // namespace
}  // namespace mercury::transport::bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  mercury::bench::RatioReporter reporter("pps", "ghash");
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
