#include "mercury/handle.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <climits>
#include <cstring>
#include <utility>

namespace mercury::worker {

struct Handle::CallbackNode {
  std::function<void(const Handle&)> fn;
  CallbackNode* next = nullptr;
};

struct Handle::State {
  // The word waiters sleep on (a futex): Status, published with release
  // after the error text, read with acquire by wait()/ready()/ok()/error().
  std::atomic<uint32_t> status{static_cast<uint32_t>(Status::kPending)};
  // Threads asleep (or about to sleep) on `status` in wait(); finish() makes
  // the wake-up system call only when there are any.
  std::atomic<uint32_t> sleepers{0};
  // Exactly-once guard: the first finish() exchanges 0 -> 1; later ones are
  // counted in `extra` and refused, so a double completion never rewrites the
  // error text a reader may be reading.
  std::atomic<uint32_t> claimed{0};
  // Registered callbacks, newest first (a Treiber stack); closed() once the
  // completing thread has taken them. Pushes are release CASes that pair with
  // the completing thread's acq_rel exchange, so it sees each node's fn.
  std::atomic<CallbackNode*> callbacks{nullptr};
  std::atomic<uint64_t> extra{0};
  uint32_t error_len = 0;
  char error[kMaxErrorBytes] = {};

  // The callback list's head after completion: registering threads that see
  // it run their callback themselves. Never dereferenced.
  static CallbackNode* closed() {
    static CallbackNode sentinel;
    return &sentinel;
  }

  ~State() {
    CallbackNode* n = callbacks.load(std::memory_order_acquire);
    while (n != nullptr && n != closed()) {
      std::unique_ptr<CallbackNode> owned(n);
      n = n->next;
    }
  }
};

Handle::Handle() : state_(std::make_shared<State>()) {}

Handle Handle::completed() {
  Handle h;
  h.complete();
  return h;
}

namespace {

constexpr auto kPending = static_cast<uint32_t>(Handle::Status::kPending);

// A few microseconds of pause instructions before sleeping: a completion that
// close costs no system call.
constexpr int kSpins = 64;

void futex_wait(std::atomic<uint32_t>& word, uint32_t expected) {
  // Returns at once (EAGAIN) unless the word still holds `expected`: the
  // check and the sleep are one step, so a wake-up cannot fall between them.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, nullptr,
          nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
          nullptr, 0);
}

}  // namespace

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "the futex word is the atomic's storage");

bool Handle::wait() const {
  // Not std::atomic::wait: libstdc++'s spins on sched_yield before it
  // sleeps, and on a CPU shared with a node's poll loop (a worker's net
  // core) every yield is a context switch that takes the CPU from the loop
  // for as long as the scheduler lets the trainer keep it.
  State& st = *state_;
  uint32_t s = st.status.load(std::memory_order_acquire);
  for (int i = 0; i < kSpins && s == kPending; ++i) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    s = st.status.load(std::memory_order_acquire);
  }
  if (s == kPending) {
    // seq_cst with finish()'s store-then-load: either this load sees the
    // new status or finish() sees a sleeper and wakes it.
    st.sleepers.fetch_add(1, std::memory_order_seq_cst);
    while ((s = st.status.load(std::memory_order_seq_cst)) == kPending) futex_wait(st.status, s);
    st.sleepers.fetch_sub(1, std::memory_order_relaxed);
  }
  return s == static_cast<uint32_t>(Status::kOk);
}

bool Handle::ready() const { return status() != Status::kPending; }

bool Handle::ok() const { return status() == Status::kOk; }

Handle::Status Handle::status() const {
  return static_cast<Status>(state_->status.load(std::memory_order_acquire));
}

std::string_view Handle::error() const {
  if (status() != Status::kFailed) return {};
  return {state_->error, state_->error_len};
}

void Handle::on_complete(std::function<void(const Handle&)> fn) const {
  auto node = std::make_unique<CallbackNode>();
  node->fn = std::move(fn);
  CallbackNode* head = state_->callbacks.load(std::memory_order_acquire);
  for (;;) {
    if (head == State::closed()) {
      // Already complete: the acquire load of the head pairs with the
      // completing thread's exchange, which follows its status store.
      node->fn(*this);
      return;
    }
    node->next = head;
    if (state_->callbacks.compare_exchange_weak(head, node.get(), std::memory_order_release,
                                                std::memory_order_acquire)) {
      node.release();  // owned by the list until the completing thread runs it
      return;
    }
  }
}

bool Handle::complete() const noexcept { return finish(Status::kOk, {}); }

bool Handle::fail(std::string_view message) const noexcept {
  return finish(Status::kFailed, message);
}

uint64_t Handle::extra_completions() const { return state_->extra.load(std::memory_order_relaxed); }

bool Handle::finish(Status status, std::string_view message) const noexcept {
  State& s = *state_;
  if (s.claimed.exchange(1, std::memory_order_acq_rel) != 0) {
    s.extra.fetch_add(1, std::memory_order_relaxed);
    assert(!"Handle completed twice");
    return false;
  }
  if (status == Status::kFailed) {
    s.error_len = static_cast<uint32_t>(std::min(message.size(), kMaxErrorBytes));
    std::memcpy(s.error, message.data(), s.error_len);
  }
  // Release: the error text (and, for the caller, the bytes it placed in the
  // trainer's buffer before completing) happen-before any acquire load that
  // sees the new status. seq_cst as well: ordered before the load of
  // `sleepers` below, as wait() needs.
  s.status.store(static_cast<uint32_t>(status), std::memory_order_seq_cst);
  if (s.sleepers.load(std::memory_order_seq_cst) != 0) futex_wake_all(s.status);
  // Close the list and run what was registered, oldest first.
  CallbackNode* list = s.callbacks.exchange(State::closed(), std::memory_order_acq_rel);
  CallbackNode* oldest_first = nullptr;
  while (list != nullptr) {
    CallbackNode* next = list->next;
    list->next = oldest_first;
    oldest_first = list;
    list = next;
  }
  while (oldest_first != nullptr) {
    std::unique_ptr<CallbackNode> node(oldest_first);
    oldest_first = node->next;
    node->fn(*this);
  }
  return true;
}

}  // namespace mercury::worker
