// sendmsg() for the executables that can host net_memif servers (ps-server,
// ps-demo, ps-worker): the C library's, except that a message to an AF_UNIX
// SOCK_SEQPACKET peer that has already closed (EPIPE) is reported sent.
//
// Why: DPDK 22.11's memif server greets each connection it accepts from EAL's
// interrupt thread, and when the greeting fails (the client closed first: it
// was killed while starting, or any process connected and closed) it closes
// the connection's descriptor but leaves it registered with that thread,
// whose next epoll_ctl on it panics (EBADF) and takes the server down
// (docs/net.md). Reported sent, the greeting lets the connection stay
// registered and open; the thread then sees the hang-up, and memif's own
// handling of a closed connection unregisters and closes it. For any
// SOCK_SEQPACKET exchange the same holds: the peer closed just after the
// message, as far as the sender can tell, and its next receive says so.
//
// The executable's definition comes first in the dynamic symbol lookup of
// every library, the PMDs EAL loads with dlopen included, once it is
// exported (link argument --export-dynamic-symbol=sendmsg, lib/net/meson.build).
#include <dlfcn.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstddef>

namespace {

using SendMsg = ssize_t (*)(int, const msghdr*, int);

SendMsg libc_sendmsg() {
  static const SendMsg real = reinterpret_cast<SendMsg>(dlsym(RTLD_NEXT, "sendmsg"));
  return real;
}

bool unix_seqpacket(int fd) {
  int value = 0;
  socklen_t len = sizeof value;
  if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &value, &len) != 0 || value != AF_UNIX) return false;
  len = sizeof value;
  return getsockopt(fd, SOL_SOCKET, SO_TYPE, &value, &len) == 0 && value == SOCK_SEQPACKET;
}

}  // namespace

extern "C" ssize_t sendmsg(int fd, const msghdr* msg, int flags) {
  const SendMsg real = libc_sendmsg();
  if (real == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  const ssize_t sent = real(fd, msg, flags);
  if (sent >= 0) return sent;
  const int error = errno;
  if (error == EPIPE && unix_seqpacket(fd)) {
    size_t bytes = 0;
    for (size_t i = 0; i < msg->msg_iovlen; ++i) bytes += msg->msg_iov[i].iov_len;
    return static_cast<ssize_t>(bytes);
  }
  errno = error;
  return sent;
}
