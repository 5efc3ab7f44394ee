// Authenticator: AES-256-GMAC over each packet with Intel's ipsec-mb, keys
// derived with HKDF-SHA256 by OpenSSL's libcrypto. See auth.h and
// docs/security.md.
//
// Why ipsec-mb for the MAC. It is the library behind DPDK's AES-GCM crypto
// PMDs (Debian's libdpdk-dev depends on it), its GMAC picks the widest
// implementation the CPU has at start (VAES and VPCLMULQDQ on AVX-512
// machines), and it is called directly here, without a cryptodev queue. A
// full 1500-byte packet's tag costs about 95 ns here against about 200 ns
// with OpenSSL 3.0's GCM mode (CLMUL GHASH) and more with EVP's AES-256-GCM
// cipher; the tags are the same (auth_test checks them against EVP's
// AES-256-GCM at several lengths). benchmarks/transport_pmd/README.md,
// "Authentication".
#include "transport/auth.h"

#include <intel-ipsec-mb.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/kdf.h>
#include <openssl/params.h>

#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>

namespace mercury::transport {

namespace {

// HKDF-SHA256(key, salt "mercury", info) -> out.
void hkdf(const AuthKey& key, const char* info, unsigned char* out, size_t len) {
  EVP_KDF* kdf = EVP_KDF_fetch(nullptr, "HKDF", nullptr);
  if (kdf == nullptr) throw std::runtime_error("auth: libcrypto has no HKDF");
  EVP_KDF_CTX* ctx = EVP_KDF_CTX_new(kdf);
  EVP_KDF_free(kdf);
  if (ctx == nullptr) throw std::runtime_error("auth: cannot create an HKDF context");
  char digest[] = "SHA256";
  char salt[] = "mercury";
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, const_cast<uint8_t*>(key.data()),
                                        key.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, salt, sizeof salt - 1),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, const_cast<char*>(info),
                                        std::strlen(info)),
      OSSL_PARAM_construct_end()};
  const int ok = EVP_KDF_derive(ctx, out, len, params);
  EVP_KDF_CTX_free(ctx);
  if (ok != 1) throw std::runtime_error("auth: HKDF failed");
}

// The GCM nonce of one packet: who sends, who receives, the sender's counter.
void nonce_of(uint16_t sender, uint16_t receiver, const wire::be64& counter, unsigned char* iv) {
  const wire::be16 s(sender), r(receiver);
  std::memcpy(iv, &s, 2);
  std::memcpy(iv + 2, &r, 2);
  std::memcpy(iv + 4, &counter, 8);
}

}  // namespace

uint32_t derive_seq_salt(const AuthKey& key) {
  unsigned char out[4];
  hkdf(key, "mercury seq salt", out, sizeof out);
  uint32_t salt;
  std::memcpy(&salt, out, sizeof salt);
  return salt;
}

uint64_t initial_auth_counter() {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  return ns > 0 ? static_cast<uint64_t>(ns) : 1;
}

struct Authenticator::Keys {
  alignas(64) gcm_key_data gcm;  // the expanded AES key and GHASH's key powers
};

void Authenticator::FreeMgr::operator()(IMB_MGR* m) const { free_mb_mgr(m); }

Authenticator::Authenticator(const AuthKey& key)
    : mgr_(alloc_mb_mgr(0)), keys_(std::make_unique<Keys>()) {
  if (mgr_ == nullptr) throw std::runtime_error("auth: cannot allocate an ipsec-mb manager");
  init_mb_mgr_auto(mgr_.get(), nullptr);  // the widest the CPU has
  if (const int err = imb_get_errno(mgr_.get()); err != 0) {
    throw std::runtime_error(std::string("auth: ipsec-mb: ") + imb_get_strerror(err));
  }
  unsigned char mac_key[32];
  hkdf(key, "mercury packet mac", mac_key, sizeof mac_key);
  IMB_AES256_GCM_PRE(mgr_.get(), mac_key, &keys_->gcm);
  OPENSSL_cleanse(mac_key, sizeof mac_key);
}

Authenticator::~Authenticator() { OPENSSL_cleanse(keys_.get(), sizeof *keys_); }

void Authenticator::tag_st(uint16_t sender, uint16_t receiver, const wire::AuthBlock& block,
                           const std::byte* header, std::span<const std::byte> payload,
                           unsigned char* tag) {
  unsigned char iv[12];
  nonce_of(sender, receiver, block.counter, iv);
  // GMAC: everything is additional data, nothing is encrypted. The header
  // and the counter are contiguous on the wire but not always in memory
  // (the sender signs before the port builds the frame), hence two updates.
  gcm_context_data ctx;
  IMB_AES256_GMAC_INIT(mgr_.get(), &keys_->gcm, &ctx, iv, sizeof iv);
  IMB_AES256_GMAC_UPDATE(mgr_.get(), &keys_->gcm, &ctx, reinterpret_cast<const uint8_t*>(header),
                         wire::kHeaderSize);
  IMB_AES256_GMAC_UPDATE(mgr_.get(), &keys_->gcm, &ctx,
                         reinterpret_cast<const uint8_t*>(&block.counter), sizeof block.counter);
  if (!payload.empty()) {
    IMB_AES256_GMAC_UPDATE(mgr_.get(), &keys_->gcm, &ctx,
                           reinterpret_cast<const uint8_t*>(payload.data()), payload.size());
  }
  IMB_AES256_GMAC_FINALIZE(mgr_.get(), &keys_->gcm, &ctx, tag, 16);
}

void Authenticator::sign_st(uint16_t sender, uint16_t receiver, uint64_t counter,
                            const std::byte* header, std::span<const std::byte> payload,
                            wire::AuthBlock& block) {
  MERCURY_OWNED(owner_);
  block.counter.set(counter);
  tag_st(sender, receiver, block, header, payload, block.tag);
}

bool Authenticator::verify_st(uint16_t sender, uint16_t receiver, const std::byte* header,
                              std::span<const std::byte> payload, const wire::AuthBlock& block) {
  MERCURY_OWNED(owner_);
  unsigned char tag[16];
  tag_st(sender, receiver, block, header, payload, tag);
  return CRYPTO_memcmp(tag, block.tag, sizeof tag) == 0;
}

}  // namespace mercury::transport
