// Authenticator: AES-256-GMAC over each packet with OpenSSL's libcrypto, keys
// derived with HKDF-SHA256. See auth.h and docs/security.md.
//
// The GMAC is OpenSSL's GCM mode (<openssl/modes.h>: CLMUL GHASH) over
// OpenSSL's AES (an EVP AES-256-ECB context as its block function), not
// EVP's AES-256-GCM cipher: the two compute the same tag (auth_test checks
// it at several lengths), but EVP's per-call IV set-up, finalisation and tag
// query cost about 250 ns a packet here against about 60 ns, which at 1500
// bytes was half of the authentication's cost (benchmarks/README.md).
#include "transport/auth.h"

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/modes.h>
#include <openssl/params.h>

#include <chrono>
#include <cstring>
#include <stdexcept>

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

namespace {

// GCM's block function: one AES-256 block through the ECB context.
void aes_block(const unsigned char in[16], unsigned char out[16], const void* ecb) {
  int len = 0;
  EVP_EncryptUpdate(static_cast<EVP_CIPHER_CTX*>(const_cast<void*>(ecb)), out, &len, in, 16);
}

}  // namespace

Authenticator::Authenticator(const AuthKey& key) : ecb_(EVP_CIPHER_CTX_new()) {
  if (ecb_ == nullptr) throw std::runtime_error("auth: cannot create a cipher context");
  unsigned char mac_key[32];
  hkdf(key, "mercury packet mac", mac_key, sizeof mac_key);
  const int ok = EVP_EncryptInit_ex(ecb_, EVP_aes_256_ecb(), nullptr, mac_key, nullptr);
  OPENSSL_cleanse(mac_key, sizeof mac_key);
  if (ok != 1 || EVP_CIPHER_CTX_set_padding(ecb_, 0) != 1) {
    EVP_CIPHER_CTX_free(ecb_);
    throw std::runtime_error("auth: cannot set up AES-256");
  }
  gcm_ = CRYPTO_gcm128_new(ecb_, &aes_block);
  if (gcm_ == nullptr) {
    EVP_CIPHER_CTX_free(ecb_);
    throw std::runtime_error("auth: cannot set up GCM");
  }
}

Authenticator::~Authenticator() {
  CRYPTO_gcm128_release(gcm_);  // wipes the hash key
  EVP_CIPHER_CTX_free(ecb_);
}

bool Authenticator::tag_st(uint16_t sender, uint16_t receiver, const wire::AuthBlock& block,
                           const std::byte* header, std::span<const std::byte> payload,
                           unsigned char* tag) {
  unsigned char iv[12];
  nonce_of(sender, receiver, block.counter, iv);
  // GMAC: everything is additional data, nothing is encrypted.
  CRYPTO_gcm128_setiv(gcm_, iv, sizeof iv);
  if (CRYPTO_gcm128_aad(gcm_, reinterpret_cast<const unsigned char*>(header), wire::kHeaderSize) !=
          0 ||
      CRYPTO_gcm128_aad(gcm_, reinterpret_cast<const unsigned char*>(&block.counter),
                        sizeof block.counter) != 0 ||
      (!payload.empty() &&
       CRYPTO_gcm128_aad(gcm_, reinterpret_cast<const unsigned char*>(payload.data()),
                         payload.size()) != 0)) {
    return false;
  }
  CRYPTO_gcm128_tag(gcm_, tag, 16);
  return true;
}

bool Authenticator::sign_st(uint16_t sender, uint16_t receiver, uint64_t counter,
                            const std::byte* header, std::span<const std::byte> payload,
                            wire::AuthBlock& block) {
  block.counter.set(counter);
  return tag_st(sender, receiver, block, header, payload, block.tag);
}

bool Authenticator::verify_st(uint16_t sender, uint16_t receiver, const std::byte* header,
                              std::span<const std::byte> payload, const wire::AuthBlock& block) {
  unsigned char tag[16];
  if (!tag_st(sender, receiver, block, header, payload, tag)) return false;
  return CRYPTO_memcmp(tag, block.tag, sizeof tag) == 0;
}

}  // namespace mercury::transport
