#pragma once
// What this process is doing, in a few words ("step 1 (SFT): epoch 1, micro-batch 7: forward and
// backward"), for the stall diagnosis of a multi-rank job: the heartbeat thread of a rank's
// Communicator publishes the latest text in the rendezvous store beside its heartbeat, and a
// rank whose collective timed out names the stalled rank together with that rank's last
// activity (src/dist/peer_monitor.h). Process-wide and thread-safe; cheap enough to call per
// micro-batch (a mutex and a string copy). Without a multi-rank job it is only kept.
#include <string>

namespace dschat {
namespace dist {

/// Replaces this process's activity text.
void set_activity(std::string text);

/// The latest text set ("" before any).
std::string current_activity();

}  // namespace dist
}  // namespace dschat
