#include "store_link.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>

#include "dschat/core/error.h"
#include "error_text.h"

namespace dschat {
namespace dist {
namespace {

struct Job {
  std::function<void(c10d::Store&)> work;
  std::shared_ptr<std::promise<void>> done;  // shared: a caller that gave up may be gone
};

}  // namespace

struct StoreLink::Shared {
  std::mutex mutex;  // guards jobs, stopping, lost
  std::condition_variable wake;
  std::deque<Job> jobs;
  bool stopping = false;
  bool lost = false;
  c10::intrusive_ptr<c10d::Store> client;  // used by the serving thread only
  std::promise<void> exited;
};

StoreLink::StoreLink(const std::string& host, int port, std::chrono::milliseconds timeout)
    : timeout_(timeout), shared_(std::make_shared<Shared>()) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(port);
  options.isServer = false;
  options.waitWorkers = false;  // not one of the job's workers: nobody counts it in
  options.timeout = timeout;
  try {
    shared_->client = c10::make_intrusive<c10d::TCPStore>(host, options);
  } catch (const std::exception& e) {
    DSCHAT_THROW(Error, "dist: cannot connect a store client to ", host, ":", port, ": ", describe_error(e));
  }
  thread_ = std::thread(serve, shared_);
}

StoreLink::~StoreLink() {
  std::future<void> exited = shared_->exited.get_future();
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->stopping = true;
  }
  shared_->wake.notify_all();
  if (exited.wait_for(timeout_) == std::future_status::ready) {
    thread_.join();
  } else {
    thread_.detach();  // stuck in a call to a hung store; it holds its own reference to the state
  }
}

void StoreLink::serve(std::shared_ptr<Shared> shared) {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(shared->mutex);
      shared->wake.wait(lock, [&] { return shared->stopping || !shared->jobs.empty(); });
      if (shared->stopping) break;
      job = std::move(shared->jobs.front());
      shared->jobs.pop_front();
    }
    try {
      job.work(*shared->client);
      job.done->set_value();
    } catch (...) {
      job.done->set_exception(std::current_exception());
    }
  }
  shared->exited.set_value();
}

bool StoreLink::call(std::function<void(c10d::Store&)> work) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> answer = done->get_future();
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    if (shared_->lost) return false;
    shared_->jobs.push_back({std::move(work), done});
  }
  shared_->wake.notify_all();
  if (answer.wait_for(timeout_) == std::future_status::ready) {
    try {
      answer.get();
      return true;
    } catch (const std::exception&) {  // the server is gone: later calls would fail the same way
    }
  }
  std::lock_guard<std::mutex> lock(shared_->mutex);
  shared_->lost = true;
  return false;
}

std::optional<int64_t> StoreLink::add(const std::string& key, int64_t delta) {
  auto value = std::make_shared<int64_t>(0);
  if (!call([key, delta, value](c10d::Store& store) { *value = store.add(key, delta); })) return std::nullopt;
  return *value;
}

bool StoreLink::set(const std::string& key, const std::string& text) {
  return call([key, text](c10d::Store& store) { store.set(key, std::vector<uint8_t>(text.begin(), text.end())); });
}

std::optional<std::string> StoreLink::get_if_set(const std::string& key) {
  auto text = std::make_shared<std::string>();
  const bool answered = call([key, text](c10d::Store& store) {
    if (!store.check({key})) return;  // get() would wait for the key
    const std::vector<uint8_t> bytes = store.get(key);
    text->assign(bytes.begin(), bytes.end());
  });
  if (!answered) return std::nullopt;
  return *text;
}

}  // namespace dist
}  // namespace dschat
