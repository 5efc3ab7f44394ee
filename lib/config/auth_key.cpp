// read_auth_key: the job key file (network.auth_key_file). Control path. The
// key never passes through the YAML, the logs or an exception's text.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "config/config.h"

namespace mercury::config {

namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Closes the descriptor and wipes the bytes read, whatever happens.
struct KeyFile {
  int fd = -1;
  char text[160] = {};
  ~KeyFile() {
    if (fd >= 0) ::close(fd);
    explicit_bzero(text, sizeof text);
  }
};

}  // namespace

std::shared_ptr<const AuthKey> read_auth_key(const std::string& path) {
  KeyFile f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) {
    throw std::runtime_error("cannot stat " + path + ": " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) throw std::runtime_error(path + " is not a regular file");
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%03o", static_cast<unsigned>(st.st_mode & 0777));
    throw std::runtime_error(path + " is open to group or others (mode " + mode +
                             "): a job key must be the owner's alone (chmod 600)");
  }
  size_t len = 0;
  while (len < sizeof f.text) {
    const ssize_t n = ::read(f.fd, f.text + len, sizeof f.text - len);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("cannot read " + path + ": " + std::strerror(errno));
    }
    if (n == 0) break;
    len += static_cast<size_t>(n);
  }
  constexpr size_t kDigits = 2 * std::tuple_size_v<AuthKey>;
  const std::string rule = path + " must hold the key as " + std::to_string(kDigits) +
                           " hex digits (openssl rand -hex 32)";
  if (len == sizeof f.text) throw std::runtime_error(rule + ", and is longer");
  size_t end = len;
  while (end > 0 && (f.text[end - 1] == '\n' || f.text[end - 1] == '\r' || f.text[end - 1] == ' ' ||
                     f.text[end - 1] == '\t')) {
    --end;
  }
  if (end != kDigits) {
    throw std::runtime_error(rule + "; it holds " + std::to_string(end) + " characters");
  }
  auto key = std::shared_ptr<AuthKey>(new AuthKey{}, [](AuthKey* k) {
    explicit_bzero(k->data(), k->size());
    delete k;
  });
  for (size_t i = 0; i < key->size(); ++i) {
    const int hi = hex_digit(f.text[2 * i]);
    const int lo = hex_digit(f.text[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      throw std::runtime_error(rule + "; character " + std::to_string(2 * i + (hi < 0 ? 1 : 2)) +
                               " is not one");
    }
    (*key)[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return key;
}

}  // namespace mercury::config
