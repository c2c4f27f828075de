#pragma once
// Liveness of the ranks of a job, kept in its rendezvous store, so that a rank whose collective
// failed can name the peer that was lost instead of only saying that "a peer" is gone.
//
// Every rank runs a thread that bumps the counter dschat/beat/<rank> once per beat (0.5 s) through
// a store client of its own (a StoreLink: the process groups keep the main one). After a
// failure, diagnose_failure() reads every counter twice, a window (1.5 s) apart: a rank whose
// counter did not move has died, hung hard or lost its network. Ranks publish what they learn, so
// those that notice later tell cause from fallout:
//   dschat/failed/<r>  r's own collective failed (it stops because of the loss, it is not the loss)
//   dschat/lost/<r>    some rank found r's heartbeat stopped
//   dschat/done/<r>    r finished its diagnosis (rank 0 keeps the store up until all have)
//   dschat/left/<r>    r destroyed its communicator normally
//   dschat/activity/<r> r's last activity (dschat/dist/activity.h), "(waiting in a collective)"
//                      appended while it is in one; republished by its heartbeat thread when it
//                      changes, so a diagnosis says where a stalled rank was
// A collective that has waited half the collective timeout logs a warning once, with the other
// ranks' activities: the stalled rank is visible well before the job fails.
// Every store call here has a short timeout: an unanswered store means its server is gone.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dschat/dist/launch_env.h"
#include "store_link.h"

namespace dschat {
namespace dist {

class PeerMonitor {
 public:
  struct Timing {
    std::chrono::milliseconds beat{500};
    std::chrono::milliseconds window{1500};  // a counter that did not move for this long has stopped
    std::chrono::milliseconds store_timeout{3000};
  };

  /// Connects its store client, publishes the first beat and starts the heartbeat thread. Throws
  /// core::Error when the store does not answer.
  PeerMonitor(const LaunchEnv& env, std::chrono::milliseconds collective_timeout, Timing timing);
  /// Stops the heartbeat thread (waits at most one store call).
  ~PeerMonitor();
  PeerMonitor(const PeerMonitor&) = delete;
  PeerMonitor& operator=(const PeerMonitor&) = delete;

  /// Brackets every collective. While one has run for almost the collective timeout, the heartbeat
  /// thread samples the peers' counters, so a diagnosis after a timeout needs no extra wait.
  void collective_started();
  void collective_finished();

  /// After this rank's collective failed: marks it failed, samples the counters a window apart
  /// and returns a clause naming the lost ranks (or saying that none stopped, or that the store
  /// itself is gone). Never throws.
  std::string diagnose_failure();

  /// Rank 0, whose process serves the store: keeps it up after a failure until every other rank
  /// finished its diagnosis, left, was found lost, or did not report a failure within two beats
  /// (it is not waiting on this job), but at most `at_most`.
  void linger_until_peers_diagnosed(std::chrono::milliseconds at_most);

  /// A normal exit: peers that fail later do not take this rank for a lost one.
  void announce_leaving();

 private:
  struct Sample {
    std::chrono::steady_clock::time_point time;
    std::vector<int64_t> beats;  // [world_size]
  };

  void heartbeat_loop();
  void sample_if_collective_is_long();
  void publish_activity();
  void warn_if_collective_is_slow();
  // false once the store failed or did not answer (then for good).
  bool read_counter(const std::string& key, int64_t* value);
  bool bump(const std::string& key);
  bool read_beats(Sample* sample);
  std::string store_gone() const;
  // "rank r's last activity: ..." ("" when it published none or the store does not answer).
  std::string activity_clause(int64_t rank);

  int64_t rank_;
  int64_t world_size_;
  std::string store_address_;  // host:port
  bool store_served_by_agent_;
  Timing timing_;
  std::chrono::milliseconds sample_after_;  // how long a collective runs before the thread samples
  std::chrono::milliseconds collective_timeout_;

  StoreLink link_;
  std::string published_activity_;  // the heartbeat thread's own

  std::mutex state_mutex_;  // guards everything below
  std::condition_variable wake_;
  bool stopping_ = false;
  int busy_count_ = 0;
  uint64_t busy_epoch_ = 0;  // one per stretch of time with a collective in flight
  std::chrono::steady_clock::time_point busy_since_;
  uint64_t sampled_epoch_ = 0;
  uint64_t warned_epoch_ = 0;  // the busy stretch a slow-collective warning was logged for
  Sample early_sample_;  // taken during epoch sampled_epoch_
  std::vector<int64_t> lost_ranks_;

  std::thread thread_;
};

}  // namespace dist
}  // namespace dschat
