#include "agg/placement.h"

#include <algorithm>
#include <charconv>
#include <numeric>
#include <stdexcept>

namespace mercury::agg {

namespace {

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

void fnv(uint64_t& h, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= 0x100000001b3ull;
  }
}

}  // namespace

std::string_view update_rule_name(UpdateRule rule) {
  switch (rule) {
    case UpdateRule::kOptimizer:
      return "optimizer";
    case UpdateRule::kAverage:
      return "average";
    case UpdateRule::kRank0:
      return "rank0";
    case UpdateRule::kOptimizerRank0:
      return "optimizer_rank0";
  }
  return "?";
}

Placement Placement::compute(std::span<const TensorDecl> tensors, uint32_t shards,
                             const PlacementOptions& options) {
  if (tensors.empty()) throw std::invalid_argument("placement: no tensors declared");
  if (shards == 0) throw std::invalid_argument("placement: zero shards");
  if (options.align_elements == 0) throw std::invalid_argument("placement: zero alignment");
  uint64_t total = 0;
  for (const TensorDecl& t : tensors) {
    if (t.elements == 0) {
      throw std::invalid_argument("placement: tensor '" + t.name + "' has no elements");
    }
    if (t.elements > kMaxTensorElements) {
      throw std::invalid_argument("placement: tensor '" + t.name + "' has " +
                                  std::to_string(t.elements) + " elements, more than 2^36");
    }
    if (static_cast<uint8_t>(t.update) >= kUpdateRules) {
      throw std::invalid_argument("placement: tensor '" + t.name + "' has update rule " +
                                  std::to_string(static_cast<int>(t.update)) +
                                  " (0 optimizer, 1 average, 2 rank0, 3 optimizer_rank0)");
    }
    if (!wire::is_tensor_dtype(t.dtype)) {
      throw std::invalid_argument("placement: tensor '" + t.name + "' has dtype " +
                                  std::string(wire::dtype_name(t.dtype)) +
                                  " (float32, bfloat16 or float16)");
    }
    // At most 2^38 bytes a tensor: the sum of 2^25 of them still fits.
    if (total > (uint64_t{1} << 62)) throw std::invalid_argument("placement: too many tensors");
    total += t.elements * wire::element_bytes(t.dtype);
  }
  uint64_t max_block = options.max_block_bytes;
  if (max_block == 0) max_block = shards > 1 ? ceil_div(total, uint64_t{8} * shards) : total;
  max_block = std::min(max_block, PlacementOptions::kMaxMessageBytes);
  const uint64_t align = options.align_elements;

  Placement p;
  p.tensor_first_.reserve(tensors.size() + 1);
  for (uint32_t t = 0; t < tensors.size(); ++t) {
    const TensorDecl& d = tensors[t];
    const uint64_t size = wire::element_bytes(d.dtype);
    p.tensor_first_.push_back(static_cast<uint32_t>(p.blocks_.size()));
    // k near-equal ranges; at least `align` elements each so that the aligned
    // boundaries below are strictly increasing.
    uint64_t k = ceil_div(d.elements * size, max_block);
    k = std::max<uint64_t>(1, std::min(k, d.elements / align));
    // Alignment could push one range past the message cap: add ranges until none does.
    while (ceil_div(d.elements, k) * size + align * size > PlacementOptions::kMaxMessageBytes &&
           k < d.elements / align) {
      ++k;
    }
    uint64_t start = 0;
    for (uint64_t j = 1; j <= k; ++j) {
      const uint64_t end = j == k ? d.elements : (d.elements * j / k) / align * align;
      if (p.blocks_.size() >= UINT32_MAX) {
        throw std::invalid_argument("placement: more than 2^32 - 1 blocks");
      }
      p.blocks_.push_back(Block{.key = static_cast<uint32_t>(p.blocks_.size()),
                                .tensor = t,
                                .first_element = start,
                                .elements = end - start,
                                .priority = d.priority,
                                .update = d.update,
                                .dtype = d.dtype});
      start = end;
    }
  }
  p.tensor_first_.push_back(static_cast<uint32_t>(p.blocks_.size()));

  // Largest first onto the least-loaded shard; every tie broken by the lower
  // index, so the result depends on nothing but the inputs.
  std::vector<uint32_t> order(p.blocks_.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return p.blocks_[a].bytes() > p.blocks_[b].bytes();
  });
  p.shard_bytes_.assign(shards, 0);
  for (uint32_t key : order) {
    const auto least = std::min_element(p.shard_bytes_.begin(), p.shard_bytes_.end());
    p.blocks_[key].shard = static_cast<uint32_t>(least - p.shard_bytes_.begin());
    *least += p.blocks_[key].bytes();
  }
  return p;
}

std::span<const Block> Placement::tensor_blocks(uint32_t tensor) const {
  const uint32_t first = tensor_first_[tensor];
  return {blocks_.data() + first, tensor_first_[tensor + 1] - first};
}

std::vector<uint32_t> Placement::shard_keys(uint32_t shard) const {
  std::vector<uint32_t> keys;
  for (const Block& q : blocks_) {
    if (q.shard == shard) keys.push_back(q.key);
  }
  return keys;
}

uint64_t Placement::fingerprint() const {
  uint64_t h = 0xcbf29ce484222325ull;
  fnv(h, blocks_.size());
  fnv(h, shard_bytes_.size());
  for (const Block& q : blocks_) {
    fnv(h, q.key);
    fnv(h, q.tensor);
    fnv(h, q.first_element);
    fnv(h, q.elements);
    fnv(h, q.shard);
    fnv(h, q.priority);
    fnv(h, static_cast<uint8_t>(q.update));
    fnv(h, static_cast<uint8_t>(q.dtype));
  }
  return h;
}

std::vector<TensorDecl> parse_model_shapes(std::string_view text) {
  std::vector<TensorDecl> out;
  size_t line_no = 0;
  while (!text.empty()) {
    ++line_no;
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    if (const size_t hash = line.find('#'); hash != std::string_view::npos) {
      line = line.substr(0, hash);
    }
    auto next_word = [&line]() {
      const size_t b = line.find_first_not_of(" \t\r");
      if (b == std::string_view::npos) {
        line = {};
        return std::string_view{};
      }
      line = line.substr(b);
      const size_t e = std::min(line.find_first_of(" \t\r"), line.size());
      const std::string_view w = line.substr(0, e);
      line = line.substr(e);
      return w;
    };
    const std::string_view name = next_word();
    if (name.empty()) continue;
    const std::string_view count = next_word();
    uint64_t elements = 0;
    const auto [ptr, ec] = std::from_chars(count.data(), count.data() + count.size(), elements);
    if (ec != std::errc{} || ptr != count.data() + count.size() || elements == 0) {
      throw std::invalid_argument("model shapes line " + std::to_string(line_no) +
                                  ": expected '<name> <elements> <shape>', got '" +
                                  std::string(name) + " " + std::string(count) + "'");
    }
    out.push_back(TensorDecl{.name = std::string(name),
                             .elements = elements,
                             .priority = static_cast<uint8_t>(std::min<size_t>(out.size(), 255))});
  }
  return out;
}

}  // namespace mercury::agg
