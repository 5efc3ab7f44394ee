// libFuzzer target for the control-message codec (agg/control.h): a server
// decodes what any worker sends it, so arbitrary bytes must either decode or
// be refused with std::invalid_argument (no crash, no UB under ASan/UBSan,
// no allocation driven by a length the bytes cannot back). A message that
// decodes must encode to bytes that decode to the same message.
#include <bit>
#include <cstdlib>
#include <stdexcept>

#include "agg/control.h"

using namespace mercury::agg;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

// Bit for bit: a NaN the bytes carry must come back as the same NaN.
bool same_values(const Hyperparameters& a, const Hyperparameters& b) {
  const float x[] = {a.learning_rate, a.momentum, a.weight_decay, a.beta1, a.beta2, a.epsilon};
  const float y[] = {b.learning_rate, b.momentum, b.weight_decay, b.beta1, b.beta2, b.epsilon};
  for (int i = 0; i < 6; ++i) {
    if (std::bit_cast<uint32_t>(x[i]) != std::bit_cast<uint32_t>(y[i])) return false;
  }
  return true;
}

bool same(const ControlMessage& a, const ControlMessage& b) {
  return a.kind == b.kind && a.rank == b.rank && a.fingerprint == b.fingerprint &&
         a.shards == b.shards && a.generation == b.generation && a.text == b.text &&
         first_difference(a.tensors, b.tensors).empty() && a.seeded == b.seeded &&
         a.version == b.version && a.sequence == b.sequence && same_values(a.values, b.values) &&
         a.cursor == b.cursor && a.last == b.last && a.bytes == b.bytes && a.lost == b.lost;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ControlMessage m;
  try {
    m = decode_control({reinterpret_cast<const std::byte*>(data), size});
  } catch (const std::invalid_argument&) {
    return 0;
  }
  const std::vector<std::byte> again = encode_control(m);
  check(again.size() == size);
  check(same(decode_control(again), m));
  return 0;
}
