#include "peer_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace mercury::pmdtest {

void ControlChannel::adopt(int fd) {
  close();
  fd_ = fd;
}

void ControlChannel::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool ControlChannel::send_bytes(const void* p, size_t n) {
  // MSG_NOSIGNAL: a peer that died is an error to report, not SIGPIPE.
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
  // MSG_TRUNC makes a message of the wrong size show its real length.
  const ssize_t got = ::recv(fd_, p, n, MSG_DONTWAIT | MSG_TRUNC);
  if (got == static_cast<ssize_t>(n)) return 1;
  if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
  return -1;  // closed (0), short or failed
}

PeerProcess::PeerProcess(const std::string& name, const std::string& flag,
                         const std::vector<std::string>& args) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) {
    throw std::runtime_error(std::string("control socket pair: ") + std::strerror(errno));
  }
  control_.adopt(fds[0]);
  // Everything the child needs is built before fork(): between fork() and
  // exec only async-signal-safe calls are allowed.
  std::vector<std::string> all = {name, flag, std::to_string(fds[1])};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ < 0) {
    const int err = errno;
    ::close(fds[1]);
    throw std::runtime_error("fork of the peer process: " + std::string(std::strerror(err)));
  }
  if (pid_ == 0) {
    // The peer dies with its parent, however the parent ends; if the parent
    // is already gone, prctl came too late and the child leaves now.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    ::fcntl(fds[1], F_SETFD, 0);  // the child's end survives exec; the parent's end does not
    ::execv("/proc/self/exe", argv.data());
    ::_exit(127);
  }
  ::close(fds[1]);
}

PeerProcess::~PeerProcess() { reap(5000); }

namespace {
int exit_code(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
}  // namespace

bool PeerProcess::exited(int& status) {
  if (pid_ <= 0) {
    status = 0;
    return true;
  }
  int s = 0;
  const pid_t r = ::waitpid(pid_, &s, WNOHANG);
  if (r == 0) return false;
  pid_ = -1;
  status = r > 0 ? exit_code(s) : -1;
  return true;
}

int PeerProcess::reap(int timeout_ms) {
  control_.close();
  if (pid_ <= 0) return 0;
  int status = 0;
  for (int waited = 0; waited < timeout_ms; waited += 10) {
    if (exited(status)) return status;
    ::usleep(10'000);
  }
  ::kill(pid_, SIGKILL);
  int s = 0;
  ::waitpid(pid_, &s, 0);
  pid_ = -1;
  return 128 + SIGKILL;
}

int peer_control_fd(int argc, char** argv, const char* flag) {
  if (argc < 3 || std::strcmp(argv[1], flag) != 0) return -1;
  return std::atoi(argv[2]);
}

std::string memif_vdev(const MemifVdev& v) {
  const std::string i = std::to_string(v.index);
  std::string s = "net_memif" + i + ",role=" + (v.server ? "server" : "client") + ",id=" + i +
                  ",socket=" + v.socket;
  if (v.slot_bytes != 0) s += ",bsize=" + std::to_string(v.slot_bytes);
  s += ",mac=" + v.mac.to_string();
  if (v.zero_copy) s += ",zero-copy=yes";
  return s;
}

std::string memif_socket(const std::string& tag) {
  return "/tmp/mercury-" + tag + "-" + std::to_string(::getpid()) + ".sock";
}

}  // namespace mercury::pmdtest
