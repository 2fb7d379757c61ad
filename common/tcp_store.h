// A rendezvous store over TCP, so that Gloo ranks on different hosts can meet: one
// TcpStoreServer (run by rank 0, or by anyone whose address all ranks are given) holds the
// keys; every rank talks to it through a TcpStore client, which is a gloo::rendezvous::Store
// and can be passed to GlooCommunicator::Create.
//
// Wire format (one request, then one reply, at a time per connection; integers are u32
// little-endian):
//   SET   'S' key value    -> 'K'
//   GET   'G' key          -> 'K' value | 'N' (not set yet)
//   CHECK 'C' n key*n      -> 'K' (all set) | 'N'
// where key and value are a u32 length and that many bytes. The server trusts nobody: a
// malformed or oversized request closes that connection.
//
// The cluster secret (common/cluster_secret.h): a server started with one answers a
// connection's requests only after its handshake
//   AUTH  'A' secret       -> 'K' (equal, compared in constant time) | 'X' and closes
// and answers any other first request with 'X' and closes; a client given a secret sends the
// handshake on connecting (Connect fails with UNAUTHENTICATED on 'X'). A server without a
// secret answers the handshake 'K' whatever it holds, so that a client with a secret still
// works against it.
//
// Thread-safety: the server is thread-safe (a thread per connection). A TcpStore client is
// used by one thread at a time, as Gloo does. As gloo::rendezvous::Store requires, client
// failures throw (gloo::IoException) with the reason.
#ifndef LLM_COMMON_TCP_STORE_H_
#define LLM_COMMON_TCP_STORE_H_

#include <atomic>
#include <chrono>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "gloo/rendezvous/store.h"

namespace llm {

class TcpStoreServer {
 public:
  // Listens on host:port (port 0: any free port, see port()). Bind to 127.0.0.1 unless ranks
  // on other hosts must reach it.
  // `secret` not empty: clients must present it (see above).
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(const std::string& host, int port,
                                                               std::string secret = "");
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  // Stops listening, closes every connection and joins the threads.
  ~TcpStoreServer();

  int port() const { return port_; }

  // Drops every key that does not begin with `prefix`; returns how many it dropped. A server
  // that outlives its groups (llm-scheduler's, across worker group rebuilds, each attempt under
  // a prefix of its own) calls it as an attempt begins, so that it holds that attempt's keys
  // rather than every attempt's since it started.
  int RetainOnly(const std::string& prefix);
  // The keys held.
  size_t num_keys() const;

 private:
  // One client's connection: its socket (-1 once closed) and the thread serving it, which
  // closes the socket and sets `done` as it ends; AcceptLoop joins and drops the ended ones.
  struct Connection {
    int fd = -1;
    std::thread thread;
    bool done = false;
  };

  TcpStoreServer(int listen_fd, int port, std::string secret);
  void AcceptLoop();
  void Serve(Connection* c);
  void ServeRequests(int fd);

  const int listen_fd_;
  const int port_;
  const std::string secret_;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  mutable std::mutex mu_;
  std::map<std::string, std::vector<char>> data_ ABSL_GUARDED_BY(mu_);
  std::list<Connection> connections_ ABSL_GUARDED_BY(mu_);  // stable addresses
};

class TcpStore : public gloo::rendezvous::Store {
 public:
  // Connects to a TcpStoreServer at host:port, retrying until `timeout` (the server may start
  // after its clients). `timeout` is also the default limit of wait() and get().
  // With `secret` not empty, presents it first; UNAUTHENTICATED when the server refuses it.
  static absl::StatusOr<std::unique_ptr<TcpStore>> Connect(const std::string& host, int port,
                                                           std::chrono::milliseconds timeout,
                                                           const std::string& secret = "");
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;
  ~TcpStore() override;

  void set(const std::string& key, const std::vector<char>& data) override;
  // Waits (up to the default timeout) for the key to be set.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  TcpStore(int fd, std::chrono::milliseconds timeout) : fd_(fd), timeout_(timeout) {}
  // Sends one request and reads the reply's status byte; throws on a transport error.
  char Call(const std::string& request);

  const int fd_;
  const std::chrono::milliseconds timeout_;
};

}  // namespace llm

#endif  // LLM_COMMON_TCP_STORE_H_
