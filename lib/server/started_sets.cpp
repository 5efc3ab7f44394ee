#include "server/started_sets.h"

#include <stdexcept>
#include <string>

namespace mercury::server {

StartedSets::StartedSets(const agg::Placement& placement, uint32_t shard, uint32_t chunk_bytes) {
  if (chunk_bytes < 4 || chunk_bytes > 65532) {
    throw std::invalid_argument("server: chunk_bytes " + std::to_string(chunk_bytes) +
                                " is not in [4, 65532]");
  }
  div_magic_ = UINT64_MAX / chunk_bytes + 1;
  keys_.resize(placement.blocks().size());
  for (const agg::Block& p : placement.blocks()) {
    if (p.shard != shard) continue;
    keys_[p.key] = Key{static_cast<uint32_t>(chunks_), static_cast<uint32_t>(p.bytes())};
    chunks_ += (p.bytes() + chunk_bytes - 1) / chunk_bytes;
  }
  view_ = std::make_unique<std::atomic<uint8_t>[]>(chunks_);  // value-initialized: all 0
}

}  // namespace mercury::server
