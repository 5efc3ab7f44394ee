// agg_optimizer_replay: runs a shard's optimizer over given gradients and
// hyperparameter changes, for a test that compares it with the same updates
// computed in torch (optimizer_torch_test.py).
//
//   agg_optimizer_replay SPEC
//
// SPEC is text, one setting per line:
//   optimizer sgd|momentum|adam|adamw
//   workers N            contributions per update
//   elements E           parameters
//   chunk C              elements per chunk (the last one may be shorter)
//   steps S
//   stop K               after K steps, write every chunk and the settings as
//                        checkpoint records (optimizer_state.h), read them into
//                        fresh memory and go on from there (0: never)
//   set V lr mu wd b1 b2 eps   hyperparameters from version V on (one line per
//                        change; version 0's is the initial one), given to the
//                        table right before the update at V, as a trainer would
//   data PATH            E float32 (initial parameters), then S x N x E float32
//                        (step-major, then rank: the gradients), little-endian
//   out PATH             written: E float32 parameters, then each state array
//
// Exit status 0, or 2 with a line on stderr naming what is wrong.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "agg/hyperparameters.h"
#include "agg/optimizer.h"
#include "agg/optimizer_state.h"

namespace {

using mercury::agg::Hyperparameters;
using mercury::agg::OptimizerConfig;
using mercury::agg::OptimizerKind;
using mercury::agg::ShardOptimizer;

constexpr uint64_t kJob = 0x6d65726375727921ull;

struct Spec {
  OptimizerConfig config;
  uint32_t workers = 1, elements = 0, chunk = 0, steps = 0, stop = 0;
  std::map<uint32_t, Hyperparameters> changes;
  std::string data, out;
};

[[noreturn]] void fail(const std::string& why) { throw std::runtime_error(why); }

Spec read_spec(const char* path) {
  std::ifstream in(path);
  if (!in) fail(std::string("cannot read ") + path);
  Spec s;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream l(line);
    std::string key;
    if (!(l >> key)) continue;
    bool ok = true;
    if (key == "optimizer") {
      std::string kind;
      l >> kind;
      const std::map<std::string, OptimizerKind> kinds = {{"sgd", OptimizerKind::kSgd},
                                                          {"momentum", OptimizerKind::kMomentum},
                                                          {"adam", OptimizerKind::kAdam},
                                                          {"adamw", OptimizerKind::kAdam}};
      if (!kinds.count(kind)) fail("unknown optimizer " + kind);
      s.config.kind = kinds.at(kind);
      s.config.decoupled_weight_decay = kind == "adamw";
    } else if (key == "workers") {
      ok = static_cast<bool>(l >> s.workers);
    } else if (key == "elements") {
      ok = static_cast<bool>(l >> s.elements);
    } else if (key == "chunk") {
      ok = static_cast<bool>(l >> s.chunk);
    } else if (key == "steps") {
      ok = static_cast<bool>(l >> s.steps);
    } else if (key == "stop") {
      ok = static_cast<bool>(l >> s.stop);
    } else if (key == "set") {
      uint32_t from;
      Hyperparameters h;
      ok = static_cast<bool>(l >> from >> h.learning_rate >> h.momentum >> h.weight_decay >>
                             h.beta1 >> h.beta2 >> h.epsilon);
      s.changes[from] = h;
    } else if (key == "data") {
      ok = static_cast<bool>(l >> s.data);
    } else if (key == "out") {
      ok = static_cast<bool>(l >> s.out);
    } else {
      fail("unknown setting " + key);
    }
    if (!ok) fail("bad line: " + line);
  }
  if (s.elements == 0 || s.chunk == 0 || s.workers == 0 || s.steps == 0 || s.data.empty() ||
      s.out.empty() || !s.changes.count(0)) {
    fail("the spec needs elements, chunk, workers, steps, data, out and a set from version 0");
  }
  const Hyperparameters& h = s.changes.at(0);
  s.config.learning_rate = h.learning_rate;
  s.config.momentum = h.momentum;
  s.config.weight_decay = h.weight_decay;
  s.config.beta1 = h.beta1;
  s.config.beta2 = h.beta2;
  s.config.epsilon = h.epsilon;
  return s;
}

// The shard: its optimizer and its memory.
struct Shard {
  ShardOptimizer optimizer;
  std::vector<float> params, s0, s1;
  uint32_t version = 0;
  Shard(const Spec& s, std::vector<float> initial)
      : optimizer(s.config, mercury::agg::SettingsMode::kFromVersion),
        params(std::move(initial)),
        s0(mercury::agg::state_floats_per_element(s.config.kind) >= 1 ? s.elements : 0),
        s1(mercury::agg::state_floats_per_element(s.config.kind) >= 2 ? s.elements : 0) {}
  std::span<float> array(std::vector<float>& a, uint32_t first, uint32_t n) {
    return a.empty() ? std::span<float>() : std::span<float>(a.data() + first, n);
  }
};

void step(const Spec& s, Shard& shard, const float* grads) {
  if (auto c = s.changes.find(shard.version); c != s.changes.end()) {
    const auto r = shard.optimizer.hyperparameters().change(shard.version, c->second, shard.version,
                                                            shard.version);
    if (!mercury::agg::accepted(r)) {
      fail("the change from version " + std::to_string(shard.version) + " was " +
           std::string(mercury::agg::change_name(r)));
    }
  }
  for (uint32_t first = 0; first < s.elements; first += s.chunk) {
    const uint32_t n = std::min(s.chunk, s.elements - first);
    std::vector<const std::byte*> src;
    for (uint32_t w = 0; w < s.workers; ++w) {
      src.push_back(reinterpret_cast<const std::byte*>(grads + uint64_t{w} * s.elements + first));
    }
    const auto& k = shard.optimizer.step_for(shard.version, s.workers, shard.version + 1, 1.0f);
    mercury::agg::reduce_apply(s.config.kind, mercury::agg::Simd::kAuto, src.data(), s.workers, n,
                               shard.params.data() + first,
                               shard.s0.empty() ? nullptr : shard.s0.data() + first,
                               shard.s1.empty() ? nullptr : shard.s1.data() + first, k);
  }
  ++shard.version;
}

// Every chunk and the settings through checkpoint records, into a new shard.
Shard resume(const Spec& s, Shard& from) {
  using namespace mercury::agg;
  std::vector<std::byte> file(hyperparameter_record_bytes(from.optimizer.hyperparameters()));
  encode_hyperparameter_record(kJob, from.optimizer.hyperparameters(), file);
  for (uint32_t first = 0; first < s.elements; first += s.chunk) {
    const uint32_t n = std::min(s.chunk, s.elements - first);
    const ChunkState c{.key = 0,
                       .offset = first * 4,
                       .version = from.version,
                       .steps = from.version,
                       .kind = s.config.kind,
                       .decoupled_weight_decay = s.config.decoupled_weight_decay};
    const size_t at = file.size();
    file.resize(at + chunk_record_bytes(c.kind, n));
    encode_chunk_record(kJob, c, from.array(from.params, first, n), from.array(from.s0, first, n),
                        from.array(from.s1, first, n), std::span(file).subspan(at));
  }
  Shard to(s, std::vector<float>(s.elements, NAN));
  std::span<const std::byte> in(file);
  if (decode_hyperparameter_record(kJob, in, to.optimizer.hyperparameters()) !=
      RecordReject::kNone) {
    fail("the hyperparameter record did not read back");
  }
  in = in.subspan(hyperparameter_record_bytes(to.optimizer.hyperparameters()));
  for (uint32_t first = 0; first < s.elements; first += s.chunk) {
    const uint32_t n = std::min(s.chunk, s.elements - first);
    const ChunkState expect{.offset = first * 4,
                            .kind = s.config.kind,
                            .decoupled_weight_decay = s.config.decoupled_weight_decay};
    RecordHeader h;
    const RecordReject r =
        decode_chunk_record(kJob, in, expect, to.array(to.params, first, n),
                            to.array(to.s0, first, n), to.array(to.s1, first, n), h);
    if (r != RecordReject::kNone) fail("a chunk record was " + std::string(record_reject_name(r)));
    to.version = h.version;
    in = in.subspan(h.record_bytes());
  }
  return to;
}

int run(const char* spec_path) {
  const Spec s = read_spec(spec_path);
  std::ifstream data(s.data, std::ios::binary);
  const uint64_t want = uint64_t{s.elements} * (1 + uint64_t{s.steps} * s.workers);
  std::vector<float> all(want);
  if (!data.read(reinterpret_cast<char*>(all.data()), static_cast<std::streamsize>(want * 4))) {
    fail("cannot read " + std::to_string(want) + " floats from " + s.data);
  }
  Shard shard(s, std::vector<float>(all.begin(), all.begin() + s.elements));
  for (uint32_t t = 0; t < s.steps; ++t) {
    if (s.stop != 0 && t == s.stop) shard = resume(s, shard);
    step(s, shard, all.data() + s.elements + uint64_t{t} * s.workers * s.elements);
  }
  std::ofstream out(s.out, std::ios::binary);
  for (const std::vector<float>* a : {&shard.params, &shard.s0, &shard.s1}) {
    out.write(reinterpret_cast<const char*>(a->data()),
              static_cast<std::streamsize>(a->size() * 4));
  }
  if (!out) fail("cannot write " + s.out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: agg_optimizer_replay SPEC\n");
    return 2;
  }
  try {
    return run(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "agg_optimizer_replay: %s\n", e.what());
    return 2;
  }
}
