#include "agg/control.h"

#include <bit>
#include <stdexcept>

namespace mercury::agg {

namespace {

constexpr uint8_t kMagic[4] = {'M', 'P', 'S', 'C'};
// 2: a declared tensor carries its dtype. 3: its update rule, rank 0's
// resume, settings and the job's state. 6: kPromotionRefused, kStandbyLost.
constexpr uint8_t kControlVersion = 6;

class Writer {
 public:
  void u8(uint8_t v) { out_.push_back(static_cast<std::byte>(v)); }
  void be(uint64_t v, int bytes) {
    for (int i = bytes - 1; i >= 0; --i) u8(static_cast<uint8_t>(v >> (8 * i)));
  }
  void text(const std::string& s, int len_bytes) {
    be(s.size(), len_bytes);
    for (char c : s) u8(static_cast<uint8_t>(c));
  }
  void blob(const std::vector<std::byte>& b) {
    if (b.size() > UINT32_MAX) throw std::invalid_argument("control message: bytes too long");
    be(b.size(), 4);
    out_.insert(out_.end(), b.begin(), b.end());
  }
  void f32(float v) { be(std::bit_cast<uint32_t>(v), 4); }
  std::vector<std::byte> take() { return std::move(out_); }

 private:
  std::vector<std::byte> out_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}
  uint64_t be(int bytes, const char* what) {
    need(static_cast<size_t>(bytes), what);
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v = (v << 8) | static_cast<uint8_t>(in_[pos_++]);
    return v;
  }
  std::string text(int len_bytes, const char* what) {
    const size_t n = be(len_bytes, what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  std::vector<std::byte> blob(const char* what) {
    const size_t n = be(4, what);
    need(n, what);
    std::vector<std::byte> b(in_.begin() + static_cast<ptrdiff_t>(pos_),
                             in_.begin() + static_cast<ptrdiff_t>(pos_ + n));
    pos_ += n;
    return b;
  }
  float f32(const char* what) { return std::bit_cast<float>(static_cast<uint32_t>(be(4, what))); }
  // A byte that must be 0 or 1, so that every message has one encoding.
  bool flag(const char* what) {
    const uint64_t v = be(1, what);
    if (v > 1) {
      throw std::invalid_argument(std::string("control message: ") + what + " is " +
                                  std::to_string(v) + ", not 0 or 1");
    }
    return v == 1;
  }
  void done() const {
    if (pos_ != in_.size()) {
      throw std::invalid_argument("control message: " + std::to_string(in_.size() - pos_) +
                                  " trailing bytes");
    }
  }
  [[nodiscard]] size_t left() const { return in_.size() - pos_; }

 private:
  void need(size_t n, const char* what) const {
    if (in_.size() - pos_ < n) {
      throw std::invalid_argument(std::string("control message: truncated at ") + what);
    }
  }
  std::span<const std::byte> in_;
  size_t pos_ = 0;
};

// "'name' (N elements, priority P)"; a dtype other than float32 is named
// before "elements", an update rule other than the optimizer's after the
// priority.
std::string describe(const TensorDecl& t) {
  std::string s = "'" + t.name + "' (" + std::to_string(t.elements);
  if (t.dtype != wire::Dtype::kFloat32) s.append(" ").append(wire::dtype_name(t.dtype));
  s += " elements, priority " + std::to_string(t.priority);
  if (t.update != UpdateRule::kOptimizer) s.append(", update ").append(update_rule_name(t.update));
  return s + ")";
}

// kSettings' values, in Hyperparameters' order.
void put_values(Writer& w, const Hyperparameters& h) {
  for (float v : {h.learning_rate, h.momentum, h.weight_decay, h.beta1, h.beta2, h.epsilon}) {
    w.f32(v);
  }
}
Hyperparameters get_values(Reader& r) {
  Hyperparameters h;
  for (float* v :
       {&h.learning_rate, &h.momentum, &h.weight_decay, &h.beta1, &h.beta2, &h.epsilon}) {
    *v = r.f32("settings values");
  }
  return h;
}

}  // namespace

std::vector<std::byte> encode_control(const ControlMessage& m) {
  Writer w;
  for (uint8_t b : kMagic) w.u8(b);
  w.u8(kControlVersion);
  w.u8(static_cast<uint8_t>(m.kind));
  switch (m.kind) {
    case ControlKind::kDeclare:
      if (m.tensors.size() > UINT32_MAX) throw std::invalid_argument("declare: too many tensors");
      w.be(m.rank, 4);
      w.be(m.tensors.size(), 4);
      for (const TensorDecl& t : m.tensors) {
        if (t.name.size() > kMaxTensorNameBytes) {
          throw std::invalid_argument("declare: tensor name longer than " +
                                      std::to_string(kMaxTensorNameBytes) + " bytes");
        }
        w.be(t.elements, 8);
        w.u8(t.priority);
        w.u8(static_cast<uint8_t>(t.dtype));
        w.u8(static_cast<uint8_t>(t.update));
        w.text(t.name, 2);
      }
      w.u8(m.seeded ? 1 : 0);
      w.be(m.version, 4);
      break;
    case ControlKind::kReady:
      w.be(m.fingerprint, 8);
      w.be(m.shards, 4);
      w.be(m.version, 4);
      break;
    case ControlKind::kRefused:
      if (m.text.size() > UINT32_MAX) throw std::invalid_argument("refused: text too long");
      w.text(m.text, 4);
      break;
    case ControlKind::kBarrier:
      w.be(m.rank, 4);
      w.be(m.generation, 8);
      break;
    case ControlKind::kBarrierDone:
      w.be(m.generation, 8);
      break;
    case ControlKind::kHeartbeat:
      break;
    case ControlKind::kLeave:
      w.be(m.rank, 4);
      break;
    // Settings and the job's state.
    case ControlKind::kSettings:
      w.be(m.sequence, 8);
      w.be(m.version, 4);
      put_values(w, m.values);
      break;
    case ControlKind::kSettingsDone:
    case ControlKind::kStateSeeded:
      if (m.text.size() > UINT32_MAX) throw std::invalid_argument("control message: text too long");
      w.be(m.sequence, 8);
      w.text(m.text, 4);
      break;
    case ControlKind::kStatePull:
      w.be(m.sequence, 8);
      w.be(m.cursor, 8);
      break;
    case ControlKind::kStatePage:
      if (m.text.size() > UINT32_MAX) throw std::invalid_argument("control message: text too long");
      w.be(m.sequence, 8);
      w.be(m.cursor, 8);
      w.u8(m.last ? 1 : 0);
      w.text(m.text, 4);
      w.blob(m.bytes);
      break;
    case ControlKind::kStateSeed:
      w.be(m.sequence, 8);
      w.u8(m.last ? 1 : 0);
      w.blob(m.bytes);
      break;
    case ControlKind::kWorkerGone:
      if (m.text.size() > UINT32_MAX) throw std::invalid_argument("control message: text too long");
      w.be(m.rank, 4);
      w.u8(m.lost ? 1 : 0);
      w.text(m.text, 4);
      break;
    case ControlKind::kJoined:
      w.be(m.fingerprint, 8);
      w.be(m.shards, 4);
      w.be(m.version, 4);
      w.be(m.generation, 8);
      w.be(m.rank, 4);
      break;
    case ControlKind::kReleased:
    case ControlKind::kStandbyLost:
      if (m.text.size() > UINT32_MAX) throw std::invalid_argument("control message: text too long");
      w.text(m.text, 4);
      break;
    case ControlKind::kWorkerJoined:
    case ControlKind::kPromotionRefused:
      if (m.text.size() > UINT32_MAX) throw std::invalid_argument("control message: text too long");
      w.be(m.rank, 4);
      w.text(m.text, 4);
      break;
    case ControlKind::kPromoted:
      if (m.text.size() > UINT32_MAX) throw std::invalid_argument("control message: text too long");
      w.be(m.version, 4);
      w.text(m.text, 4);
      break;
    case ControlKind::kRollback:
      w.be(m.rank, 4);
      w.be(m.version, 4);
      break;
    default:
      throw std::invalid_argument("control message: unknown kind " +
                                  std::to_string(static_cast<int>(m.kind)));
  }
  return w.take();
}

ControlMessage decode_control(std::span<const std::byte> bytes) {
  Reader r(bytes);
  for (uint8_t b : kMagic) {
    if (r.be(1, "magic") != b) throw std::invalid_argument("control message: bad magic");
  }
  const uint64_t version = r.be(1, "version");
  if (version != kControlVersion) {
    throw std::invalid_argument("control message: version " + std::to_string(version) +
                                ", this build speaks " + std::to_string(kControlVersion));
  }
  ControlMessage m;
  const uint64_t kind = r.be(1, "kind");
  m.kind = static_cast<ControlKind>(kind);
  switch (m.kind) {
    case ControlKind::kDeclare: {
      m.rank = static_cast<uint32_t>(r.be(4, "rank"));
      const uint64_t n = r.be(4, "tensor count");
      // Each tensor takes at least 12 bytes: refuse a count the buffer cannot
      // hold before reserving for it.
      if (n > r.left() / 12) throw std::invalid_argument("control message: truncated tensor list");
      m.tensors.reserve(n);
      for (uint64_t i = 0; i < n; ++i) {
        TensorDecl t;
        t.elements = r.be(8, "tensor elements");
        t.priority = static_cast<uint8_t>(r.be(1, "tensor priority"));
        const uint64_t dtype = r.be(1, "tensor dtype");
        const uint64_t update = r.be(1, "tensor update rule");
        t.name = r.text(2, "tensor name");
        if (update >= kUpdateRules) {
          throw std::invalid_argument("control message: tensor '" + t.name + "' has update rule " +
                                      std::to_string(update) +
                                      " (0 optimizer, 1 average, 2 rank0)");
        }
        t.update = static_cast<UpdateRule>(update);
        if (t.name.size() > kMaxTensorNameBytes) {
          throw std::invalid_argument("control message: a tensor name of " +
                                      std::to_string(t.name.size()) + " bytes (at most " +
                                      std::to_string(kMaxTensorNameBytes) + ")");
        }
        if (t.elements > kMaxTensorElements) {
          throw std::invalid_argument("control message: tensor '" + t.name + "' has " +
                                      std::to_string(t.elements) + " elements (at most 2^36)");
        }
        if (t.elements == 0) {
          throw std::invalid_argument("control message: tensor '" + t.name + "' has no elements");
        }
        t.dtype = static_cast<wire::Dtype>(dtype);
        if (!wire::is_tensor_dtype(t.dtype)) {
          throw std::invalid_argument("control message: tensor '" + t.name + "' has dtype " +
                                      std::to_string(dtype) +
                                      " (1 float32, 2 bfloat16 or 3 float16)");
        }
        m.tensors.push_back(std::move(t));
      }
      m.seeded = r.flag("seeded");
      m.version = static_cast<uint32_t>(r.be(4, "version"));
      break;
    }
    case ControlKind::kReady:
      m.fingerprint = r.be(8, "fingerprint");
      m.shards = static_cast<uint32_t>(r.be(4, "shards"));
      m.version = static_cast<uint32_t>(r.be(4, "version"));
      break;
    case ControlKind::kRefused:
      m.text = r.text(4, "text");
      break;
    case ControlKind::kBarrier:
      m.rank = static_cast<uint32_t>(r.be(4, "rank"));
      m.generation = r.be(8, "generation");
      break;
    case ControlKind::kBarrierDone:
      m.generation = r.be(8, "generation");
      break;
    case ControlKind::kHeartbeat:
      break;
    case ControlKind::kLeave:
      m.rank = static_cast<uint32_t>(r.be(4, "rank"));
      break;
    // Settings and the job's state.
    case ControlKind::kSettings:
      m.sequence = r.be(8, "sequence");
      m.version = static_cast<uint32_t>(r.be(4, "version"));
      m.values = get_values(r);
      break;
    case ControlKind::kSettingsDone:
    case ControlKind::kStateSeeded:
      m.sequence = r.be(8, "sequence");
      m.text = r.text(4, "text");
      break;
    case ControlKind::kStatePull:
      m.sequence = r.be(8, "sequence");
      m.cursor = r.be(8, "cursor");
      break;
    case ControlKind::kStatePage:
      m.sequence = r.be(8, "sequence");
      m.cursor = r.be(8, "cursor");
      m.last = r.flag("last");
      m.text = r.text(4, "text");
      m.bytes = r.blob("records");
      break;
    case ControlKind::kStateSeed:
      m.sequence = r.be(8, "sequence");
      m.last = r.flag("last");
      m.bytes = r.blob("records");
      break;
    case ControlKind::kWorkerGone:
      m.rank = static_cast<uint32_t>(r.be(4, "rank"));
      m.lost = r.flag("lost");
      m.text = r.text(4, "text");
      break;
    case ControlKind::kJoined:
      m.fingerprint = r.be(8, "fingerprint");
      m.shards = static_cast<uint32_t>(r.be(4, "shards"));
      m.version = static_cast<uint32_t>(r.be(4, "version"));
      m.generation = r.be(8, "generation");
      m.rank = static_cast<uint32_t>(r.be(4, "rank"));
      break;
    case ControlKind::kReleased:
    case ControlKind::kStandbyLost:
      m.text = r.text(4, "text");
      break;
    case ControlKind::kWorkerJoined:
    case ControlKind::kPromotionRefused:
      m.rank = static_cast<uint32_t>(r.be(4, "rank"));
      m.text = r.text(4, "text");
      break;
    case ControlKind::kPromoted:
      m.version = static_cast<uint32_t>(r.be(4, "version"));
      m.text = r.text(4, "text");
      break;
    case ControlKind::kRollback:
      m.rank = static_cast<uint32_t>(r.be(4, "rank"));
      m.version = static_cast<uint32_t>(r.be(4, "version"));
      break;
    default:
      throw std::invalid_argument("control message: unknown kind " + std::to_string(kind));
  }
  r.done();
  return m;
}

std::string first_difference(std::span<const TensorDecl> a, std::span<const TensorDecl> b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    if (a[i].name != b[i].name || a[i].elements != b[i].elements ||
        a[i].priority != b[i].priority || a[i].update != b[i].update || a[i].dtype != b[i].dtype) {
      return "tensor " + std::to_string(i) + " is " + describe(a[i]) + " on one side and " +
             describe(b[i]) + " on the other";
    }
  }
  if (a.size() != b.size()) {
    return "one side declares " + std::to_string(a.size()) + " tensors, the other " +
           std::to_string(b.size());
  }
  return "";
}

}  // namespace mercury::agg
