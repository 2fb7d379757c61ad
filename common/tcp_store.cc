// TcpStoreServer and TcpStore: a key-value rendezvous over TCP sockets (see tcp_store.h for the
// wire format).
#include "common/tcp_store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/cluster_secret.h"
#include "gloo/common/error.h"

namespace llm {
namespace {

constexpr uint32_t kMaxKeyBytes = 4096;
constexpr uint32_t kMaxValueBytes = 16 << 20;
constexpr uint32_t kMaxKeysPerCheck = 1 << 16;
constexpr auto kPollInterval = std::chrono::milliseconds(10);

bool WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t r = recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool ReadU32(int fd, uint32_t* v) {
  unsigned char b[4];
  if (!ReadAll(fd, reinterpret_cast<char*>(b), 4)) return false;
  *v = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  return true;
}

// A u32 length (at most max) and that many bytes.
bool ReadBytes(int fd, uint32_t max, std::string* out) {
  uint32_t n = 0;
  if (!ReadU32(fd, &n) || n > max) return false;
  out->resize(n);
  return ReadAll(fd, out->data(), n);
}

void AppendU32(std::string* s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void AppendBytes(std::string* s, const char* p, size_t n) {
  AppendU32(s, static_cast<uint32_t>(n));
  s->append(p, n);
}

void SetTimeouts(int fd, std::chrono::milliseconds timeout) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(const std::string& host,
                                                                      int port,
                                                                      std::string secret) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port_str = std::to_string(port);
  if (int err = getaddrinfo(host.c_str(), port_str.c_str(), &hints, &res); err != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tcp store: cannot resolve ", host, ": ", gai_strerror(err)));
  }
  std::string last_error = "no address";
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 128) != 0) {
      last_error = std::strerror(errno);
      close(fd);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
    const int bound_port =
        ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    freeaddrinfo(res);
    std::unique_ptr<TcpStoreServer> server(new TcpStoreServer(fd, bound_port, std::move(secret)));
    server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
    return server;
  }
  freeaddrinfo(res);
  return absl::UnavailableError(
      absl::StrCat("tcp store: cannot listen on ", host, ":", port, ": ", last_error));
}

TcpStoreServer::TcpStoreServer(int listen_fd, int port, std::string secret)
    : listen_fd_(listen_fd), port_(port), secret_(std::move(secret)) {}

TcpStoreServer::~TcpStoreServer() {
  stopping_.store(true);
  shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
  if (accept_thread_.joinable()) accept_thread_.join();
  close(listen_fd_);
  std::list<Connection> connections;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Under mu_, so that no fd is closed (and its number reused) between the check and here.
    for (Connection& c : connections_) {
      if (c.fd >= 0) shutdown(c.fd, SHUT_RDWR);  // wakes recv()
    }
    connections = std::move(connections_);
  }
  for (Connection& c : connections) c.thread.join();
}

int TcpStoreServer::RetainOnly(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(
      std::erase_if(data_, [&](const auto& entry) { return !entry.first.starts_with(prefix); }));
}

size_t TcpStoreServer::num_keys() const {
  std::lock_guard<std::mutex> lock(mu_);
  return data_.size();
}

void TcpStoreServer::AcceptLoop() {
  while (!stopping_.load()) {
    const int fd = accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // shut down
    }
    // Every group attempt connects anew: the ended connections' threads are joined here, so
    // that a long-lived server holds only the connections that are open.
    std::list<Connection> ended;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = connections_.begin(); it != connections_.end();) {
        auto next = std::next(it);
        if (it->done) ended.splice(ended.end(), connections_, it);
        it = next;
      }
      Connection& c = connections_.emplace_back();
      c.fd = fd;
      c.thread = std::thread([this, conn = &c] { Serve(conn); });
    }
    for (Connection& c : ended) c.thread.join();
  }
}

// One connection's requests until it closes or sends something malformed; then the
// connection is shut down (the client sees it closed) and closed, under mu_ (see the
// destructor).
void TcpStoreServer::Serve(Connection* c) {
  ServeRequests(c->fd);
  std::lock_guard<std::mutex> lock(mu_);
  shutdown(c->fd, SHUT_RDWR);
  close(c->fd);
  c->fd = -1;
  c->done = true;
}

void TcpStoreServer::ServeRequests(int fd) {
  bool authenticated = secret_.empty();
  while (true) {
    char op = 0;
    if (!ReadAll(fd, &op, 1)) return;
    std::string reply;
    if (op == 'A') {
      std::string presented;
      if (!ReadBytes(fd, kMaxKeyBytes, &presented)) return;
      if (!secret_.empty() && !ConstantTimeEquals(presented, secret_)) {
        (void)WriteAll(fd, "X", 1);
        return;
      }
      authenticated = true;
      reply = "K";
    } else if (!authenticated) {
      (void)WriteAll(fd, "X", 1);  // a stranger: refused, whatever it asked
      return;
    } else if (op == 'S') {
      std::string key, value;
      if (!ReadBytes(fd, kMaxKeyBytes, &key) || !ReadBytes(fd, kMaxValueBytes, &value)) return;
      {
        std::lock_guard<std::mutex> lock(mu_);
        data_[key] = std::vector<char>(value.begin(), value.end());
      }
      reply = "K";
    } else if (op == 'G') {
      std::string key;
      if (!ReadBytes(fd, kMaxKeyBytes, &key)) return;
      std::lock_guard<std::mutex> lock(mu_);
      auto it = data_.find(key);
      if (it == data_.end()) {
        reply = "N";
      } else {
        reply = "K";
        AppendBytes(&reply, it->second.data(), it->second.size());
      }
    } else if (op == 'C') {
      uint32_t n = 0;
      if (!ReadU32(fd, &n) || n > kMaxKeysPerCheck) return;
      std::vector<std::string> keys(n);
      for (std::string& key : keys) {
        if (!ReadBytes(fd, kMaxKeyBytes, &key)) return;
      }
      std::lock_guard<std::mutex> lock(mu_);
      bool all = true;
      for (const std::string& key : keys) all = all && data_.count(key) > 0;
      reply = all ? "K" : "N";
    } else {
      return;
    }
    if (!WriteAll(fd, reply.data(), reply.size())) return;
  }
}

absl::StatusOr<std::unique_ptr<TcpStore>> TcpStore::Connect(const std::string& host, int port,
                                                            std::chrono::milliseconds timeout,
                                                            const std::string& secret) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const std::string port_str = std::to_string(port);
  std::string last_error;
  do {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* res = nullptr;
    if (int err = getaddrinfo(host.c_str(), port_str.c_str(), &hints, &res); err != 0) {
      last_error = gai_strerror(err);
    } else {
      for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
        const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          freeaddrinfo(res);
          const int one = 1;
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          SetTimeouts(fd, timeout);
          if (!secret.empty()) {
            std::string hello = "A";
            AppendBytes(&hello, secret.data(), secret.size());
            char reply = 0;
            if (!WriteAll(fd, hello.data(), hello.size()) || !ReadAll(fd, &reply, 1) ||
                reply != 'K') {
              close(fd);
              return absl::UnauthenticatedError(
                  absl::StrCat("tcp store at ", host, ":", port,
                               " refused this process's cluster secret (LLM_CLUSTER_SECRET / "
                               "--cluster-secret-file must be the group's)"));
            }
          }
          return std::unique_ptr<TcpStore>(new TcpStore(fd, timeout));
        }
        last_error = std::strerror(errno);
        close(fd);
      }
      freeaddrinfo(res);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  } while (std::chrono::steady_clock::now() < deadline);
  return absl::UnavailableError(absl::StrCat("tcp store: cannot connect to ", host, ":", port,
                                             " within ", timeout.count(), " ms: ", last_error));
}

TcpStore::~TcpStore() { close(fd_); }

char TcpStore::Call(const std::string& request) {
  char status = 0;
  if (!WriteAll(fd_, request.data(), request.size()) || !ReadAll(fd_, &status, 1)) {
    throw gloo::IoException(
        absl::StrCat("tcp store: lost the connection to the server: ", std::strerror(errno)));
  }
  if (status == 'X') {
    throw gloo::IoException(
        "tcp store: the server requires the cluster secret (LLM_CLUSTER_SECRET / "
        "--cluster-secret-file) and this process presented none");
  }
  return status;
}

void TcpStore::set(const std::string& key, const std::vector<char>& data) {
  std::string request = "S";
  AppendBytes(&request, key.data(), key.size());
  AppendBytes(&request, data.data(), data.size());
  if (Call(request) != 'K') throw gloo::IoException("tcp store: set of " + key + " failed");
}

std::vector<char> TcpStore::get(const std::string& key) {
  std::string request = "G";
  AppendBytes(&request, key.data(), key.size());
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (true) {
    if (Call(request) == 'K') {
      std::string value;
      if (!ReadBytes(fd_, kMaxValueBytes, &value)) {
        throw gloo::IoException("tcp store: truncated value of " + key);
      }
      return std::vector<char>(value.begin(), value.end());
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      throw gloo::IoException(
          absl::StrCat("tcp store: key ", key, " was not set within ", timeout_.count(), " ms"));
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

void TcpStore::wait(const std::vector<std::string>& keys,
                    const std::chrono::milliseconds& timeout) {
  std::string request = "C";
  AppendU32(&request, static_cast<uint32_t>(keys.size()));
  for (const std::string& key : keys) AppendBytes(&request, key.data(), key.size());
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (Call(request) != 'K') {
    if (std::chrono::steady_clock::now() >= deadline) {
      throw gloo::IoException(absl::StrCat("tcp store: ", keys.size(),
                                           " keys were not all set within ", timeout.count(),
                                           " ms, e.g. ", keys.empty() ? "" : keys[0]));
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

}  // namespace llm
