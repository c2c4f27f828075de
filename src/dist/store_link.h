#pragma once
// A TCPStore client whose every call has a deadline. LibTorch's client blocks in recv() without a
// timeout on add/get/set, so a store whose server is hung (its process stopped, its host cut off)
// would hang the caller forever; here the client lives on a thread of its own, callers wait for
// the answer at most `timeout`, and a call that misses it marks the store lost for good. A thread
// still stuck at destruction is left behind (it owns what it uses) instead of hanging the caller.

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <functional>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>

namespace c10d {
class Store;
}

namespace dschat {
namespace dist {

class StoreLink {
 public:
  /// Connects a client to the store at host:port (within `timeout`). Throws core::Error naming
  /// the address when it cannot.
  StoreLink(const std::string& host, int port, std::chrono::milliseconds timeout);
  ~StoreLink();
  StoreLink(const StoreLink&) = delete;
  StoreLink& operator=(const StoreLink&) = delete;

  /// store.add(key, delta): the new value (delta 0 reads a counter, creating it at 0), or nullopt
  /// when the store failed or did not answer in time, then and on every later call.
  std::optional<int64_t> add(const std::string& key, int64_t delta);
  /// store.set(key, text); false when the store failed or did not answer in time.
  bool set(const std::string& key, const std::string& text);
  /// The text under `key` ("" when nobody set it; never blocks on a missing key), or nullopt
  /// when the store failed or did not answer in time.
  std::optional<std::string> get_if_set(const std::string& key);

 private:
  struct Shared;
  static void serve(std::shared_ptr<Shared> shared);
  // Runs `work` on the serving thread within the deadline; false (then for good) when it failed
  // or timed out. `work` owns what it writes (a caller that gave up may be gone).
  bool call(std::function<void(c10d::Store&)> work);

  std::chrono::milliseconds timeout_;
  std::shared_ptr<Shared> shared_;
  std::thread thread_;
};

}  // namespace dist
}  // namespace dschat
