#include "peer_monitor.h"

#include <algorithm>

#include "core/log.h"
#include "dschat/core/error.h"
#include "dschat/dist/activity.h"

namespace dschat {
namespace dist {
namespace {

using Clock = std::chrono::steady_clock;

std::string key(const char* kind, int64_t rank) { return std::string("dschat/") + kind + "/" + std::to_string(rank); }

std::string rank_list(const std::vector<int64_t>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  return text;
}

}  // namespace

PeerMonitor::PeerMonitor(const LaunchEnv& env, std::chrono::milliseconds collective_timeout, Timing timing)
    : rank_(env.rank),
      world_size_(env.world_size),
      store_address_(env.master_addr + ":" + std::to_string(env.master_port)),
      store_served_by_agent_(env.store_served_by_agent),
      timing_(timing),
      sample_after_(std::max(std::chrono::milliseconds(0), collective_timeout - timing.window - 2 * timing.beat)),
      collective_timeout_(collective_timeout),
      link_(env.master_addr, env.master_port, timing.store_timeout) {
  DSCHAT_CHECK(bump(key("beat", rank_)), Error, "dist: rank ", rank_, " cannot publish its heartbeat in the store at ",
               store_address_, " (no answer within ", timing.store_timeout.count(), " ms)");
  thread_ = std::thread([this] { heartbeat_loop(); });
}

PeerMonitor::~PeerMonitor() {
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();  // its store calls have deadlines
}

bool PeerMonitor::read_counter(const std::string& name, int64_t* value) {
  // add(key, 0) reads a counter without blocking on a key nobody wrote yet (get() would).
  std::optional<int64_t> answer = link_.add(name, 0);
  if (answer) *value = *answer;
  return answer.has_value();
}

bool PeerMonitor::bump(const std::string& name) { return link_.add(name, 1).has_value(); }

bool PeerMonitor::read_beats(Sample* sample) {
  sample->beats.assign(static_cast<size_t>(world_size_), 0);
  for (int64_t rank = 0; rank < world_size_; ++rank) {
    if (!read_counter(key("beat", rank), &sample->beats[rank])) return false;
  }
  sample->time = Clock::now();
  return true;
}

void PeerMonitor::heartbeat_loop() {
  std::unique_lock<std::mutex> lock(state_mutex_);
  while (!stopping_) {
    lock.unlock();
    bump(key("beat", rank_));
    publish_activity();
    sample_if_collective_is_long();
    warn_if_collective_is_slow();
    lock.lock();
    wake_.wait_for(lock, timing_.beat, [&] { return stopping_; });
  }
}

void PeerMonitor::publish_activity() {
  bool waiting = false;
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    waiting = busy_count_ > 0;
  }
  std::string activity = current_activity();
  if (waiting) activity += activity.empty() ? "waiting in a collective" : " (waiting in a collective)";
  if (activity != published_activity_ && link_.set(key("activity", rank_), activity)) published_activity_ = activity;
}

void PeerMonitor::warn_if_collective_is_slow() {
  Clock::time_point since;
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    if (busy_count_ == 0 || warned_epoch_ == busy_epoch_ || Clock::now() - busy_since_ < collective_timeout_ / 2) {
      return;
    }
    warned_epoch_ = busy_epoch_;
    since = busy_since_;
  }
  std::string others;
  for (int64_t rank = 0; rank < world_size_; ++rank) {
    const std::string clause = rank == rank_ ? std::string() : activity_clause(rank);
    if (!clause.empty()) others += "; " + clause;
  }
  const auto waited = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - since).count();
  core::log_warn("dist: rank ", rank_, " has waited ", waited, " s in a collective for the other ranks (the job fails "
                 "at the collective timeout of ", collective_timeout_.count() / 1000.0, " s)", others);
}

void PeerMonitor::sample_if_collective_is_long() {
  uint64_t epoch = 0;
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    if (busy_count_ == 0 || sampled_epoch_ == busy_epoch_ || Clock::now() - busy_since_ < sample_after_) return;
    epoch = busy_epoch_;
  }
  Sample sample;
  if (!read_beats(&sample)) return;
  std::lock_guard<std::mutex> lock(state_mutex_);
  if (busy_count_ > 0 && busy_epoch_ == epoch) {
    early_sample_ = std::move(sample);
    sampled_epoch_ = epoch;
  }
}

void PeerMonitor::collective_started() {
  std::lock_guard<std::mutex> lock(state_mutex_);
  if (busy_count_++ == 0) {
    busy_since_ = Clock::now();
    ++busy_epoch_;
  }
}

void PeerMonitor::collective_finished() {
  std::lock_guard<std::mutex> lock(state_mutex_);
  if (busy_count_ > 0) --busy_count_;
}

std::string PeerMonitor::store_gone() const {
  if (store_served_by_agent_) {
    return "the rendezvous store at " + store_address_ +
           " does not answer either: torchrun's agent on the first node, which serves it, is gone";
  }
  return "the rendezvous store at " + store_address_ +
         " does not answer either: rank 0, which serves it, is gone or hung (its process died or stopped, "
         "or its host is unreachable)";
}

std::string PeerMonitor::activity_clause(int64_t rank) {
  const std::optional<std::string> text = link_.get_if_set(key("activity", rank));
  if (!text || text->empty()) return "";
  return "rank " + std::to_string(rank) + "'s last activity: " + *text;
}

std::string PeerMonitor::diagnose_failure() {
  if (!bump(key("failed", rank_))) return store_gone();
  Sample first;
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    // Only a recent one: a rank that died after an older sample would still look alive in it.
    if (busy_count_ > 0 && sampled_epoch_ == busy_epoch_ && Clock::now() - early_sample_.time <= 2 * timing_.window) {
      first = early_sample_;
    }
  }
  if (first.beats.empty() && !read_beats(&first)) return store_gone();
  std::this_thread::sleep_until(first.time + timing_.window);
  Sample second;
  if (!read_beats(&second)) return store_gone();

  std::vector<int64_t> lost, fallout, left;
  for (int64_t rank = 0; rank < world_size_; ++rank) {
    if (rank == rank_ || second.beats[rank] != first.beats[rank]) continue;
    int64_t found_lost = 0, failed = 0, gone_normally = 0;
    if (!read_counter(key("lost", rank), &found_lost) || !read_counter(key("failed", rank), &failed) ||
        !read_counter(key("left", rank), &gone_normally)) {
      return store_gone();
    }
    if (found_lost > 0 || (failed == 0 && gone_normally == 0)) {
      lost.push_back(rank);
    } else if (failed > 0) {
      fallout.push_back(rank);
    } else {
      left.push_back(rank);
    }
  }
  for (int64_t rank : lost) bump(key("lost", rank));
  bump(key("done", rank_));
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    lost_ranks_ = lost;
  }

  std::vector<std::string> clauses;
  if (!lost.empty()) {
    clauses.push_back("lost " + rank_list(lost) + (lost.size() == 1 ? " (its heartbeat" : " (their heartbeats") +
                      " in the store stopped: the process died, hung or lost its network)");
  }
  if (!fallout.empty()) clauses.push_back(rank_list(fallout) + " stopped after a collective failed there too");
  if (!left.empty()) clauses.push_back(rank_list(left) + " had already left the job (destroyed its communicator)");
  if (clauses.empty()) {
    clauses.push_back(
        "every other rank's heartbeat is still advancing, so none died: one is alive but did not join this "
        "collective (collectives called in a different order on different ranks, or a rank stuck in other work)");
    // Where each one is: the rank stuck in other work names itself here.
    for (int64_t rank = 0; rank < world_size_; ++rank) {
      const std::string clause = rank == rank_ ? std::string() : activity_clause(rank);
      if (!clause.empty()) clauses.push_back(clause);
    }
  }
  for (int64_t rank : lost) {
    const std::string clause = activity_clause(rank);
    if (!clause.empty()) clauses.push_back(clause);
  }
  std::string text;
  for (const std::string& clause : clauses) text += (text.empty() ? "" : "; ") + clause;
  return text;
}

void PeerMonitor::linger_until_peers_diagnosed(std::chrono::milliseconds at_most) {
  const auto start = Clock::now();
  // Closing the Gloo connections makes every rank involved fail within moments; one that has not
  // reported a failure by then is not waiting on this job (hung, or busy elsewhere) and would only
  // hold this rank's exit up.
  const auto notice_by = start + timing_.beat * 2;
  std::vector<int64_t> known_lost;
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    known_lost = lost_ranks_;
  }
  while (Clock::now() < start + at_most) {
    bool all_settled = true;
    for (int64_t rank = 0; rank < world_size_ && all_settled; ++rank) {
      if (rank == rank_ || std::find(known_lost.begin(), known_lost.end(), rank) != known_lost.end()) continue;
      int64_t done = 0, left = 0, lost = 0, failed = 0;
      if (!read_counter(key("done", rank), &done) || !read_counter(key("left", rank), &left) ||
          !read_counter(key("lost", rank), &lost) || !read_counter(key("failed", rank), &failed)) {
        return;
      }
      all_settled = done > 0 || left > 0 || lost > 0 || (failed == 0 && Clock::now() > notice_by);
    }
    if (all_settled) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void PeerMonitor::announce_leaving() {
  bump(key("left", rank_));
}

}  // namespace dist
}  // namespace dschat
