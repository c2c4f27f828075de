// The handle of a collective started without waiting (Communicator::start_all_gather_into).
#include "communicator_impl.h"

namespace dschat {
namespace dist {

PendingCollective::PendingCollective() = default;
PendingCollective::PendingCollective(std::unique_ptr<State> state) : state_(std::move(state)) {}
PendingCollective::PendingCollective(PendingCollective&&) noexcept = default;

PendingCollective& PendingCollective::operator=(PendingCollective&& other) noexcept {
  if (this != &other) {
    try {
      wait();
    } catch (const std::exception&) {  // recorded in the communicator: its next call reports it
    }
    state_ = std::move(other.state_);
  }
  return *this;
}

PendingCollective::~PendingCollective() {
  try {
    wait();
  } catch (const std::exception&) {  // recorded in the communicator: its next call reports it
  }
}

void PendingCollective::wait() {
  if (!state_) return;
  std::unique_ptr<State> state = std::move(state_);  // whatever happens, a second wait() is a no-op
  Communicator::Impl& impl = *state->impl;
  struct Finish {
    Communicator::Impl& impl;
    ~Finish() { impl.finished(); }
  } finish{impl};
  try {
    state->work->wait();
  } catch (const std::exception& e) {
    state->work.reset();
    impl.fail(state->op, e);
  }
}

}  // namespace dist
}  // namespace dschat
