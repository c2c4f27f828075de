#include "dschat/dist/process_group.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <sstream>
#include <vector>

#include "dschat/core/error.h"
#include "communicator_impl.h"

// The wheel ships ProcessGroupGloo.hpp but not the gloo headers it includes; Debian's libgloo-dev
// supplies them. Only declarations are taken from there (the ProcessGroupGloo code, and the gloo
// it runs, is libtorch_cpu's own), and every gloo type in the class layout sits behind a pointer.
#if defined(USE_C10D_GLOO) && __has_include(<gloo/algorithm.h>)
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#define DSCHAT_DIST_HAS_GLOO 1
#endif
#if defined(DSCHAT_WITH_CUDA) && defined(USE_C10D_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#define DSCHAT_DIST_HAS_NCCL 1
#endif

namespace dschat {
namespace dist {
namespace {

using Milliseconds = std::chrono::milliseconds;

bool is_loopback(const std::string& addr) {
  return addr.rfind("127.", 0) == 0 || addr == "localhost" || addr == "::1";
}

c10::intrusive_ptr<c10d::Store> connect_store(const LaunchEnv& env, Milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(env.master_port);
  // Under torchrun the agent already serves the store on that port: everyone is a client there.
  options.isServer = env.rank == 0 && !env.store_served_by_agent;
  // Every rank (server included) counts itself in; the server's constructor returns once all
  // world_size ranks have, so a missing rank surfaces here as a timeout, not later as a hang.
  options.numWorkers = static_cast<size_t>(env.world_size);
  options.waitWorkers = true;
  options.timeout = timeout;
  try {
    return c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
  } catch (const std::exception& e) {
    DSCHAT_THROW(Error, "dist: rendezvous at ", env.master_addr, ":", env.master_port, " failed for rank ", env.rank,
                 " of ", env.world_size, " within ", timeout.count(), " ms (",
                 env.store_served_by_agent ? "torchrun's agent" : "rank 0",
                 " serves the store there: check that every rank has the same MASTER_ADDR/"
                 "MASTER_PORT, that the port is free on rank 0, and that all ranks were started): ",
                 describe_error(e));
  }
}

c10::intrusive_ptr<c10d::Backend> make_gloo(const c10::intrusive_ptr<c10d::Store>& store, const LaunchEnv& env,
                                            Milliseconds timeout) {
#ifdef DSCHAT_DIST_HAS_GLOO
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  if (!env.socket_ifname.empty()) {
    // torch.distributed reads GLOO_SOCKET_IFNAME as a comma list: one device per interface.
    std::stringstream names(env.socket_ifname);
    for (std::string name; std::getline(names, name, ',');) {
      if (!name.empty()) options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
    }
  } else if (is_loopback(env.master_addr)) {
    // A job that rendezvouses on loopback is on one host: bind there too, so it does not depend on
    // the hostname resolving (containers, sandboxes).
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  } else {
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  // The constructor connects the full mesh of ranks, with `timeout` on every connect and read.
  return c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>("gloo", store),
                                                     static_cast<int>(env.rank), static_cast<int>(env.world_size),
                                                     options);
#else
  (void)store, (void)env, (void)timeout;
  DSCHAT_THROW(Unsupported, "dist: this build has no Gloo backend: the gloo headers that LibTorch's "
               "ProcessGroupGloo.hpp includes were not found at build time (install libgloo-dev and rebuild)");
#endif
}

c10::intrusive_ptr<c10d::Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, const LaunchEnv& env,
                                            Milliseconds timeout) {
#ifdef DSCHAT_DIST_HAS_NCCL
  // NCCL communicators are created lazily on the device of the first CUDA tensor; the caller picks
  // that device (the engine sets LOCAL_RANK's). NCCL's own watchdog enforces `timeout`.
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(c10::make_intrusive<c10d::PrefixStore>("nccl", store),
                                                     static_cast<int>(env.rank), static_cast<int>(env.world_size),
                                                     options);
#else
  (void)store, (void)env, (void)timeout;
  DSCHAT_THROW(Unsupported, "dist: Backend::Nccl needs a dschat build with CUDA (DSCHAT_WITH_CUDA)");
#endif
}

}  // namespace

void check_dense(const at::Tensor& tensor, const char* op, const char* name) {
  DSCHAT_CHECK(tensor.defined(), InvalidArgument, "dist::", op, ": ", name, " is undefined");
  DSCHAT_CHECK(tensor.layout() == at::kStrided && tensor.is_contiguous(), InvalidArgument, "dist::", op, ": ",
               name, " must be a contiguous dense tensor, got sizes ", tensor.sizes(), " strides ",
               tensor.strides());
  DSCHAT_CHECK(tensor.is_cpu() || tensor.is_cuda(), InvalidArgument, "dist::", op, ": ", name, " is on ",
               tensor.device(), "; only CPU and CUDA tensors are supported");
}

void check_pair(const at::Tensor& output, const at::Tensor& input, const char* op) {
  check_dense(output, op, "output");
  check_dense(input, op, "input");
  DSCHAT_CHECK(output.scalar_type() == input.scalar_type() && output.device() == input.device(),
               InvalidArgument, "dist::", op, ": output (", output.scalar_type(), " on ", output.device(),
               ") and input (", input.scalar_type(), " on ", input.device(), ") differ in dtype or device");
}

// How long rank 0 keeps the store up after a failure for the other ranks' diagnoses: their
// window plus slack for ranks that notice the failure a little later.
constexpr Milliseconds kStoreLingerAfterFailure{4000};

Communicator::Impl::~Impl() {
  if (monitor) {
    if (failed_operation.empty()) {
      monitor->announce_leaving();
    } else if (serves_store) {
      monitor->linger_until_peers_diagnosed(kStoreLingerAfterFailure);
    }
    monitor.reset();
  }
}

void Communicator::Impl::check_usable(const char* op) const {
  DSCHAT_CHECK(failed_operation.empty(), Error, "dist::", op, ": this communicator is unusable since ",
               failed_operation, " failed on rank ", rank);
}

c10d::Backend& Communicator::Impl::group_for(const at::Tensor& tensor, const char* op) {
  check_usable(op);
  if (tensor.is_cuda()) {
    DSCHAT_CHECK(cuda_group, InvalidArgument, "dist::", op,
                 ": got a CUDA tensor, but this communicator was created without Backend::Nccl");
    return *cuda_group;
  }
  return *cpu_group;
}

void Communicator::Impl::started() {
  ++in_flight;
  if (monitor) monitor->collective_started();
}

void Communicator::Impl::finished() {
  --in_flight;
  if (monitor) monitor->collective_finished();
}

// Peers fail in two ways, both bounded by `timeout`: a dead one closes its sockets (Gloo reports it
// at once), a stuck one stops answering (Gloo's per-operation timeout). Either way the ranks no
// longer agree on the collective sequence, so the communicator refuses further calls instead of
// mismatching them.
void Communicator::Impl::fail(const char* op, const std::exception& error) {
  failed_operation = op;
  std::string diagnosis;
  if (monitor) {
    // Closing this rank's Gloo connections fails the peers still blocked on it now, so they
    // diagnose in the same window instead of at their timeout. Only when nothing else is in
    // flight: the group's destructor waits for queued work.
    if (in_flight == 1) cpu_group.reset();
    diagnosis = "; " + monitor->diagnose_failure();
  }
  DSCHAT_THROW(Error, "dist::", op, " failed on rank ", rank, " of ", world_size,
               ": a peer rank is gone or did not answer within the ", timeout.count(), " ms timeout (",
               describe_error(error), ")", diagnosis);
}

void Communicator::Impl::run(const char* op, const std::function<c10::intrusive_ptr<c10d::Work>()>& start) {
  check_usable(op);
  started();
  struct Finish {
    Impl& impl;
    ~Finish() { impl.finished(); }
  } finish{*this};
  try {
    start()->wait();
  } catch (const std::exception& e) {
    fail(op, e);
  }
}

c10::intrusive_ptr<c10d::Work> Communicator::Impl::start(const char* op,
                                                      const std::function<c10::intrusive_ptr<c10d::Work>()>& launch) {
  check_usable(op);
  started();
  try {
    return launch();
  } catch (const std::exception& e) {
    finished();
    failed_operation = op;
    DSCHAT_THROW(Error, "dist::", op, " failed to start on rank ", rank, ": ", describe_error(e));
  }
}

Communicator::Communicator(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
Communicator::Communicator(Communicator&&) noexcept = default;
Communicator& Communicator::operator=(Communicator&&) noexcept = default;
Communicator::~Communicator() = default;

Communicator Communicator::create(const LaunchEnv& env, Backend backend, Milliseconds timeout) {
  DSCHAT_CHECK(env.world_size >= 1 && env.rank >= 0 && env.rank < env.world_size, InvalidArgument,
               "dist: rank ", env.rank, " is out of range for world size ", env.world_size);
  DSCHAT_CHECK(timeout.count() > 0, InvalidArgument, "dist: timeout must be positive, got ", timeout.count(),
               " ms");
#ifndef DSCHAT_DIST_HAS_NCCL
  DSCHAT_CHECK(backend != Backend::Nccl, Unsupported,
               "dist: Backend::Nccl needs a dschat build with CUDA (DSCHAT_WITH_CUDA)");
#endif
  auto impl = std::make_shared<Impl>();
  impl->rank = env.rank;
  impl->world_size = env.world_size;
  impl->backend = backend;
  impl->timeout = timeout;
  impl->serves_store = env.rank == 0 && !env.store_served_by_agent;
  impl->env = env;
  if (env.world_size > 1) {
    impl->store = connect_store(env, timeout);
    // Before the Gloo mesh: once any rank's mesh is up, every rank has published a heartbeat.
    impl->monitor = std::make_unique<PeerMonitor>(env, timeout, PeerMonitor::Timing{});
    try {
      impl->cpu_group = make_gloo(impl->store, env, timeout);
      if (backend == Backend::Nccl) impl->cuda_group = make_nccl(impl->store, env, timeout);
    } catch (const core::Error&) {
      throw;
    } catch (const std::exception& e) {
      DSCHAT_THROW(Error, "dist: connecting rank ", env.rank, " of ", env.world_size,
                   " to its peers failed within ", timeout.count(), " ms: ", describe_error(e));
    }
  }
  return Communicator(std::move(impl));
}

int64_t Communicator::rank() const { return impl_->rank; }
int64_t Communicator::world_size() const { return impl_->world_size; }
Backend Communicator::backend() const { return impl_->backend; }
Milliseconds Communicator::timeout() const { return impl_->timeout; }

void Communicator::all_reduce(at::Tensor& tensor, ReduceOp op) { start_all_reduce(tensor, op).wait(); }

void Communicator::broadcast(at::Tensor& tensor, int64_t src) {
  check_dense(tensor, "broadcast", "tensor");
  DSCHAT_CHECK(src >= 0 && src < impl_->world_size, InvalidArgument, "dist::broadcast: src rank ", src,
               " is out of range for world size ", impl_->world_size);
  if (impl_->world_size == 1 || tensor.numel() == 0) return;
  c10d::BroadcastOptions options;
  options.rootRank = src;
  c10d::Backend& group = impl_->group_for(tensor, "broadcast");
  impl_->run("broadcast", [&] {
    std::vector<at::Tensor> tensors{tensor};
    return group.broadcast(tensors, options);
  });
}

void Communicator::all_gather_into(at::Tensor& output, const at::Tensor& input) {
  start_all_gather_into(output, input).wait();
}

void Communicator::reduce_scatter(at::Tensor& output, const at::Tensor& input) {
  start_reduce_scatter(output, input).wait();
}

Communicator Communicator::subgroup(const std::vector<int64_t>& ranks) {
  Impl& parent = *impl_;
  parent.check_usable("subgroup");
  std::string listed;  // "0,1" for the error and the store prefix
  for (int64_t rank : ranks) listed += (listed.empty() ? "" : ",") + std::to_string(rank);
  const auto self = std::find(ranks.begin(), ranks.end(), parent.rank);
  DSCHAT_CHECK(!ranks.empty() && std::is_sorted(ranks.begin(), ranks.end()) &&
                   std::adjacent_find(ranks.begin(), ranks.end()) == ranks.end() && ranks.front() >= 0 &&
                   ranks.back() < parent.world_size && self != ranks.end(),
               InvalidArgument, "dist::subgroup: ranks [", listed, "] must be ascending, distinct, below the world size ",
               parent.world_size, " and include this rank (", parent.rank, ")");
  const std::string name = "group" + std::to_string(parent.subgroups++) + ":" + listed;
  auto impl = std::make_shared<Impl>();
  impl->rank = self - ranks.begin();
  impl->world_size = static_cast<int64_t>(ranks.size());
  impl->backend = parent.backend;
  impl->timeout = parent.timeout;
  impl->env = parent.env;
  impl->env.rank = impl->rank;
  impl->env.world_size = impl->world_size;
  if (impl->world_size > 1) {
    // No peer monitor of its own: the parent's watches the same processes.
    impl->store = c10::make_intrusive<c10d::PrefixStore>(name, parent.store);
    try {
      impl->cpu_group = make_gloo(impl->store, impl->env, impl->timeout);
      if (impl->backend == Backend::Nccl) impl->cuda_group = make_nccl(impl->store, impl->env, impl->timeout);
    } catch (const core::Error&) {
      throw;
    } catch (const std::exception& e) {
      DSCHAT_THROW(Error, "dist: connecting rank ", parent.rank, " to its subgroup ", name, " failed within ",
                   impl->timeout.count(), " ms: ", describe_error(e));
    }
  }
  return Communicator(std::move(impl));
}

void Communicator::barrier() {
  if (impl_->world_size == 1) return;
  impl_->check_usable("barrier");
  c10d::Backend& group = *impl_->cpu_group;  // a host-side barrier also orders NCCL ranks' hosts
  impl_->run("barrier", [&] { return group.barrier(); });
}

}  // namespace dist
}  // namespace dschat
