#include "memif_link.h"

#include <rte_cycles.h>
#include <rte_mbuf.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <stdexcept>
#include <vector>

#include "net/port.h"

namespace mercury::bench::memif {

namespace {
constexpr int kReplyTimeoutMs =
    5000;  // a run's start or stop; the receiver answers in ~1 s at most
constexpr int kReapTimeoutMs = 5000;
}  // namespace

std::string memif_vdev(bool server, const std::string& socket) {
  return memif_vdev(server, socket, 0);
}

std::string memif_vdev(bool server, const std::string& socket, uint16_t index) {
  return memif_vdev(server, socket, index, false);
}

std::string memif_vdev(bool receiver, const std::string& socket, uint16_t index,
                       bool receiver_zero_copy) {
  const std::string i = std::to_string(index);
  const bool server = receiver != receiver_zero_copy;
  return "net_memif" + i + ",role=" + (server ? "server" : "client") + ",id=" + i +
         ",socket=" + socket + ",bsize=" + std::to_string(kSlotBytes) +
         ",mac=" + (receiver ? kReceiverMac : kSenderMac).to_string() +
         (receiver_zero_copy && !server ? ",zero-copy=yes" : "");
}

bool Stall::stuck(uint16_t progress) {
  if (progress != 0) {
    since_ = 0;
    return false;
  }
  const uint64_t now = rte_rdtsc();
  if (since_ == 0) since_ = now;
  return now - since_ > rte_get_tsc_hz();
}

uint16_t send_raw_burst(net::Port& port, rte_mempool* pool, std::span<const std::byte> source,
                        size_t frame, uint16_t n, size_t& offset, Stall& stall,
                        std::string& failure) {
  rte_mbuf* burst[64];
  if (n > 64) n = 64;
  if (rte_pktmbuf_alloc_bulk(pool, burst, n) != 0) {
    failure = "the sender's mempool is empty";
    return 0;
  }
  for (uint16_t i = 0; i < n; ++i) {
    if (offset + frame > source.size()) offset = 0;
    std::memcpy(rte_pktmbuf_mtod(burst[i], void*), source.data() + offset, frame);
    offset += frame;
    burst[i]->data_len = static_cast<uint16_t>(frame);
    burst[i]->pkt_len = static_cast<uint32_t>(frame);
  }
  uint16_t done = 0;
  while (done < n) {
    const uint16_t went = port.tx_burst(0, burst + done, n - done);
    done += went;
    if (stall.stuck(went)) break;
  }
  if (done < n) {
    rte_pktmbuf_free_bulk(burst + done, n - done);
    failure = "memif took nothing for 1 s";
  }
  return done;
}

uint64_t clock_ns(int clock) {
  timespec t{};
  ::clock_gettime(clock, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1'000'000'000 + static_cast<uint64_t>(t.tv_nsec);
}

void ControlChannel::adopt(int fd) {
  close();
  fd_ = fd;
}

void ControlChannel::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool ControlChannel::send_bytes(const void* p, size_t n) {
  // MSG_NOSIGNAL: a receiver that died is an error to report, not SIGPIPE.
  return fd_ >= 0 && ::send(fd_, p, n, MSG_NOSIGNAL) == static_cast<ssize_t>(n);
}

int ControlChannel::receive_bytes(void* p, size_t n, int timeout_ms) {
  if (fd_ < 0) return -1;
  if (timeout_ms != 0) {
    pollfd pfd{fd_, POLLIN, 0};
    int r;
    do {
      r = ::poll(&pfd, 1, timeout_ms);
    } while (r < 0 && errno == EINTR);
    if (r == 0) return 0;
    if (r < 0) return -1;
  }
  // SOCK_SEQPACKET keeps message boundaries: a message is whole or absent,
  // and MSG_TRUNC makes one of the wrong size show its real length.
  const ssize_t got = ::recv(fd_, p, n, MSG_DONTWAIT | MSG_TRUNC);
  if (got == static_cast<ssize_t>(n)) return 1;
  if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
  return -1;  // closed (0), short or failed
}

PeerProcess::PeerProcess(const std::string& socket, const std::string& extra) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) {
    throw std::runtime_error(std::string("control socket pair: ") + std::strerror(errno));
  }
  control_.adopt(fds[0]);
  // Everything the child needs is built before fork(): between fork() and
  // exec only async-signal-safe calls are allowed.
  std::vector<std::string> args = {"memif_rate_peer", "--peer", std::to_string(fds[1]), socket};
  if (!extra.empty()) args.push_back(extra);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ < 0) {
    const int err = errno;
    ::close(fds[1]);
    throw std::runtime_error(std::string("fork of the receiver: ") + std::strerror(err));
  }
  if (pid_ == 0) {
    // The receiver dies with the sender, however the sender ends; if the
    // sender is already gone, prctl came too late and the child leaves now.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    ::fcntl(fds[1], F_SETFD, 0);  // the child's end survives exec; the parent's end does not
    ::execv("/proc/self/exe", argv.data());
    ::_exit(127);
  }
  ::close(fds[1]);
}

PeerProcess::~PeerProcess() { quit(); }

void PeerProcess::go() {
  Command c;
  c.kind = Command::Kind::kGo;
  if (!control_.send(c)) throw std::runtime_error("the receiver process is gone");
}

void PeerProcess::wait_ready(int timeout_ms) {
  Report ready;
  const int got = control_.receive(ready, timeout_ms);
  if (got == 1) return;
  throw std::runtime_error(got == 0 ? "the receiver process is not ready after " +
                                          std::to_string(timeout_ms / 1000) + " s"
                                    : "the receiver process failed to start (see its message)");
}

bool PeerProcess::start(Variant v, uint32_t frame, Report& ack, std::string& error) {
  Command c;
  c.kind = Command::Kind::kStart;
  c.variant = v;
  c.frame = frame;
  if (control_.send(c) && control_.receive(ack, kReplyTimeoutMs) == 1) return true;
  error = "the receiver process did not answer start";
  return false;
}

bool PeerProcess::stop(uint64_t sent, Report& out, std::string& error) {
  Command c;
  c.kind = Command::Kind::kStop;
  c.sent = sent;
  if (control_.send(c) && control_.receive(out, kReplyTimeoutMs) == 1) return true;
  error = "the receiver process did not answer stop";
  return false;
}

int PeerProcess::quit() {
  if (pid_ <= 0) return 0;
  Command c;
  c.kind = Command::Kind::kQuit;
  control_.send(c);
  control_.close();  // a receiver that missed kQuit sees the socket close
  int status = 0;
  for (int waited = 0; waited < kReapTimeoutMs; waited += 10) {
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    if (r < 0) {
      pid_ = -1;
      return -1;
    }
    ::usleep(10'000);
  }
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  return 128 + SIGKILL;
}

}  // namespace mercury::bench::memif
