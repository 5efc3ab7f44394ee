// Typed big-endian integers for wire headers.
//
// A field declared BigEndian<uint32_t> is stored in network byte order and can
// only be read or written through get()/set(), so no raw htons/ntohl is ever
// scattered through protocol code and a field cannot be used un-swapped by
// mistake. The type is trivially copyable, has the size and alignment of a
// byte array, and is safe to overlay on packet memory at any offset.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace mercury::wire {

template <typename T>
requires std::is_unsigned_v<T>
class BigEndian {
 public:
  BigEndian() = default;
  explicit BigEndian(T host) { set(host); }

  [[nodiscard]] T get() const {
    T v;
    std::memcpy(&v, bytes_, sizeof(T));
    return to_host(v);
  }
  void set(T host) {
    T v = to_host(host);  // byte swap is its own inverse
    std::memcpy(bytes_, &v, sizeof(T));
  }

 private:
  static T to_host(T v) {
    if constexpr (std::endian::native == std::endian::little && sizeof(T) > 1) {
      // std::byteswap is C++23; the builtins compile to one bswap/movbe.
      if constexpr (sizeof(T) == 2) return static_cast<T>(__builtin_bswap16(v));
      if constexpr (sizeof(T) == 4) return static_cast<T>(__builtin_bswap32(v));
      if constexpr (sizeof(T) == 8) return static_cast<T>(__builtin_bswap64(v));
    } else {
      return v;
    }
  }
  unsigned char bytes_[sizeof(T)];
};

using be16 = BigEndian<uint16_t>;
using be32 = BigEndian<uint32_t>;
using be64 = BigEndian<uint64_t>;

static_assert(sizeof(be16) == 2 && alignof(be16) == 1);
static_assert(sizeof(be32) == 4 && alignof(be32) == 1);
static_assert(sizeof(be64) == 8 && alignof(be64) == 1);
static_assert(std::is_trivially_copyable_v<be64>);

}  // namespace mercury::wire
