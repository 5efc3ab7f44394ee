// Timeline (timeline.h): recording, and the Chrome trace's JSON.
#include "worker/timeline.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <numeric>

namespace mercury::worker {

namespace {

// Tensor rows come after the trainer's tracks, in priority order.
constexpr uint32_t kTensorRowBase = 1000;

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  out += '"';
}

void append_micros(std::string& out, uint64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%llu.%03llu", static_cast<unsigned long long>(ns / 1000),
                static_cast<unsigned long long>(ns % 1000));
  out += buf;
}

void append_event(std::string& out, std::string_view name, uint32_t pid, uint32_t tid,
                  uint64_t begin_ns, uint64_t end_ns, std::string_view args) {
  out += "{\"name\":";
  append_json_string(out, name);
  out += ",\"ph\":\"X\",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(tid) +
         ",\"ts\":";
  append_micros(out, begin_ns);
  out += ",\"dur\":";
  append_micros(out, end_ns - begin_ns);
  if (!args.empty()) {
    out += ",\"args\":{";
    out += args;
    out += '}';
  }
  out += "},\n";
}

void append_meta(std::string& out, std::string_view what, uint32_t pid, int64_t tid,
                 std::string_view key, std::string_view value_json) {
  out += "{\"name\":\"";
  out += what;
  out += "\",\"ph\":\"M\",\"pid\":" + std::to_string(pid);
  if (tid >= 0) out += ",\"tid\":" + std::to_string(tid);
  out += ",\"args\":{\"";
  out += key;
  out += "\":";
  out += value_json;
  out += "}},\n";
}

}  // namespace

Timeline::Timeline(std::string path, std::string node, uint32_t rank, size_t events)
    : path_(std::move(path)), node_(std::move(node)), rank_(rank) {
  events_.reserve(events);
}

uint64_t Timeline::now_ns() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

void Timeline::span(std::string_view name, std::string_view track, uint64_t begin_ns,
                    uint64_t end_ns) {
  std::lock_guard lock(mutex_);
  if (spans_.size() >= kMaxSpans) {
    ++dropped_spans_;
    return;
  }
  auto it = std::find(tracks_.begin(), tracks_.end(), track);
  const auto index = static_cast<uint32_t>(it - tracks_.begin());
  if (it == tracks_.end()) tracks_.emplace_back(track);
  spans_.push_back(Span{std::string(name), index, begin_ns, std::max(begin_ns, end_ns)});
}

std::string Timeline::write(const TensorTable& table) const {
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  std::string node_json;
  append_json_string(node_json, node_);
  append_meta(out, "process_name", rank_, -1, "name", node_json);
  append_meta(out, "process_sort_index", rank_, -1, "sort_index", std::to_string(rank_));

  {
    std::lock_guard lock(mutex_);
    for (uint32_t k = 0; k < tracks_.size(); ++k) {
      std::string name;
      append_json_string(name, tracks_[k]);
      append_meta(out, "thread_name", rank_, k + 1, "name", name);
      append_meta(out, "thread_sort_index", rank_, k + 1, "sort_index", std::to_string(k + 1));
    }
    for (const Span& s : spans_) {
      append_event(out, s.name, rank_, s.track + 1, s.begin_ns, s.end_ns, "");
    }
  }

  // Tensor rows, most urgent first.
  const uint32_t n = table.tensors();
  std::vector<TensorId> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](TensorId a, TensorId b) {
    return table.tensor(a).priority < table.tensor(b).priority;
  });
  for (uint32_t i = 0; i < n; ++i) {
    const TensorInfo& t = table.tensor(order[i]);
    std::string name;
    append_json_string(name, t.name);
    append_meta(out, "thread_name", rank_, kTensorRowBase + order[i], "name", name);
    append_meta(out, "thread_sort_index", rank_, kTensorRowBase + order[i], "sort_index",
                std::to_string(kTensorRowBase + i));
  }

  // Each (tensor, iteration)'s marks, then its phases.
  std::vector<Event> events = events_;
  std::stable_sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return a.tensor != b.tensor ? a.tensor < b.tensor : a.iteration < b.iteration;
  });
  constexpr size_t kMarks = 5;
  static constexpr const char* kPhase[kMarks - 1] = {"queued", "push", "aggregate", "pull"};
  for (size_t i = 0; i < events.size();) {
    size_t j = i;
    uint64_t at[kMarks] = {};
    bool seen[kMarks] = {};
    while (j < events.size() && events[j].tensor == events[i].tensor &&
           events[j].iteration == events[i].iteration) {
      const auto m = static_cast<size_t>(events[j].mark);
      if (!seen[m]) at[m] = events[j].ns;
      seen[m] = true;
      ++j;
    }
    const TensorId t = events[i].tensor;
    const std::string args = "\"iteration\":" + std::to_string(events[i].iteration) +
                             ",\"bytes\":" + std::to_string(table.tensor(t).buffer.size_bytes());
    for (size_t p = 0; p + 1 < kMarks; ++p) {
      if (seen[p] && seen[p + 1] && at[p + 1] >= at[p]) {
        append_event(out, kPhase[p], rank_, kTensorRowBase + t, at[p], at[p + 1], args);
      }
    }
    i = j;
  }
  if (out.size() >= 2 && out[out.size() - 2] == ',') out.erase(out.size() - 2, 1);
  out += "]}\n";

  std::FILE* f = std::fopen(path_.c_str(), "w");
  if (f == nullptr) return path_ + ": " + std::strerror(errno);
  const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed) return path_ + ": " + std::strerror(errno);
  return "";
}

}  // namespace mercury::worker
