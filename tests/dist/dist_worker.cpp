// One rank of the multi-process dist tests (tests/dist/process_group_test.cpp starts world_size of
// these). Joins the job from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT like any dschat program, runs
// one scenario, prints "PASS <check>" or "FAIL <check>: ..." per check on stdout and exits 0 when
// every check passed; a dschat error goes to stderr with exit status 1.
//
// usage: dschat_dist_worker <scenario> <timeout_ms> [steps]
//   collectives   every collective (and the start_* forms) on rank-dependent inputs, compared with
//                 closed forms
//   peer_exits    rank 1 kills itself after joining; rank 0 then all_reduces (must throw)
//   peer_hangs    rank 1 sleeps after joining; rank 0 then all_reduces (must time out)
//   steps         `steps` rounds of all_reduce 50 ms apart, printing "rank R step I" after each
//                 (and "rank R pid P" first): a job for tests that kill a rank half way
//   async_gather  start_all_gather_into: overlapping handles, waited out of order, twice, moved,
//                 and destroyed unwaited
//   subgroups     (4 ranks) pairs {0, 1} and {2, 3} (DeepSpeed's tensor-parallel groups of 2),
//                 then {0, 2, 3} and {1} alone: all_reduce and all_gather within each, the world's
//                 all_reduce in between
#include <ATen/ATen.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dschat/core/error.h"
#include "dschat/dist/process_group.h"
#include "../worker_args.h"

namespace {

using dschat::dist::Communicator;
using dschat::dist::ReduceOp;

int failures = 0;

void expect_equal(const std::string& check, const at::Tensor& got, const at::Tensor& expected) {
  if (got.scalar_type() == expected.scalar_type() && got.sizes() == expected.sizes() && at::equal(got, expected)) {
    std::cout << "PASS " << check << "\n";
  } else {
    ++failures;
    std::cout << "FAIL " << check << ": got " << got << " expected " << expected << "\n";
  }
}

int64_t now_ns() {
  // steady_clock is CLOCK_MONOTONIC on Linux: one clock for every process on the host.
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void run_collectives(Communicator& comm) {
  const int64_t w = comm.world_size();
  const int64_t r = comm.rank();
  const int64_t rank_sum = w * (w - 1) / 2;

  at::Tensor sum_f = at::arange(7, at::kFloat) + r;  // [7]
  comm.all_reduce(sum_f, ReduceOp::Sum);
  expect_equal("all_reduce_sum_float", sum_f, at::arange(7, at::kFloat) * w + rank_sum);

  at::Tensor sum_i = at::full({5}, r + 1, at::kLong);  // [5]
  comm.all_reduce(sum_i, ReduceOp::Sum);
  expect_equal("all_reduce_sum_int64", sum_i, at::full({5}, w * (w + 1) / 2, at::kLong));

  at::Tensor max_t = at::tensor({static_cast<float>(r), static_cast<float>(-r), 3.0f});  // [3]
  comm.all_reduce(max_t, ReduceOp::Max);
  expect_equal("all_reduce_max", max_t, at::tensor({static_cast<float>(w - 1), 0.0f, 3.0f}));

  at::Tensor avg = at::full({3}, static_cast<double>(r), at::kDouble);  // [3]
  comm.all_reduce(avg, ReduceOp::Avg);
  expect_equal("all_reduce_avg", avg, at::full({3}, (w - 1) / 2.0, at::kDouble));

  const int64_t src = w - 1;
  at::Tensor bcast = at::full({2, 3}, r * 10, at::kInt);  // [2, 3]
  comm.broadcast(bcast, src);
  expect_equal("broadcast_from_last", bcast, at::full({2, 3}, src * 10, at::kInt));

  at::Tensor bcast_bf16 = at::full({1}, static_cast<double>(r + 2), at::kBFloat16);  // [1]
  comm.broadcast(bcast_bf16, 0);
  expect_equal("broadcast_bf16_from_0", bcast_bf16, at::full({1}, 2.0, at::kBFloat16));

  at::Tensor gather_in = at::arange(3, at::kFloat) + 10 * r;  // [3]
  at::Tensor gathered = at::empty({w * 3}, at::kFloat);       // [w * 3]
  comm.all_gather_into(gathered, gather_in);
  expect_equal("all_gather_n3", gathered,
               (at::arange(3, at::kFloat).unsqueeze(0) + 10 * at::arange(w, at::kFloat).unsqueeze(1)).reshape({-1}));

  at::Tensor one = at::full({1}, r * r, at::kLong);         // [1]
  at::Tensor gathered_one = at::empty({w, 1}, at::kLong);  // [w, 1]: any shape with w * n elements
  comm.all_gather_into(gathered_one, one);
  expect_equal("all_gather_n1_int64", gathered_one, at::arange(w, at::kLong).pow(2).reshape({w, 1}));

  // input_r = (r + 1) * arange(w * n): the sum over ranks is w (w + 1) / 2 * arange(w * n), of which
  // this rank keeps elements [r * n, (r + 1) * n).
  const int64_t n = 5;
  at::Tensor scatter_in = at::arange(w * n, at::kFloat) * (r + 1);  // [w * n]
  at::Tensor scatter_out = at::empty({n}, at::kFloat);              // [n]
  comm.reduce_scatter(scatter_out, scatter_in);
  expect_equal("reduce_scatter_n5", scatter_out, at::arange(r * n, (r + 1) * n, at::kFloat) * (w * (w + 1) / 2));

  at::Tensor scatter_in_i = at::full({w * 3}, r, at::kInt);  // [w * 3]
  at::Tensor scatter_out_i = at::empty({3}, at::kInt);       // [3]
  comm.reduce_scatter(scatter_out_i, scatter_in_i);
  expect_equal("reduce_scatter_n3_int32", scatter_out_i, at::full({3}, rank_sum, at::kInt));

  at::Tensor scatter_in_b = at::ones({w}, at::kBFloat16);  // [w]
  at::Tensor scatter_out_b = at::empty({1}, at::kBFloat16);
  comm.reduce_scatter(scatter_out_b, scatter_in_b);
  expect_equal("reduce_scatter_n1_bf16", scatter_out_b, at::full({1}, static_cast<double>(w), at::kBFloat16));

  // The start_* forms, three in flight at once and waited out of order. Uneven counts: rank i
  // receives i elements (rank 0 none, yet it still sends its segments to the others).
  std::vector<int64_t> counts;
  for (int64_t i = 0; i < w; ++i) counts.push_back(i);
  const int64_t total = w * (w - 1) / 2;
  const int64_t first = r * (r - 1) / 2;                           // where rank r's segment starts
  at::Tensor uneven_in = at::arange(total, at::kFloat) * (r + 1);  // [total]
  at::Tensor uneven_out = at::empty({r}, at::kFloat);              // [r]
  dschat::dist::PendingCollective uneven = comm.start_reduce_scatter(uneven_out, uneven_in, counts);
  at::Tensor even_in = at::arange(w * 4, at::kDouble) + r;  // [w * 4]
  at::Tensor even_out = at::empty({4}, at::kDouble);        // [4]
  dschat::dist::PendingCollective even = comm.start_reduce_scatter(even_out, even_in);
  at::Tensor averaged = at::full({2}, static_cast<double>(r), at::kFloat);  // [2]
  dschat::dist::PendingCollective average = comm.start_all_reduce(averaged, ReduceOp::Avg);
  average.wait();
  even.wait();
  uneven.wait();
  expect_equal("start_reduce_scatter_uneven", uneven_out,
               at::arange(first, first + r, at::kFloat) * static_cast<double>(w * (w + 1) / 2));
  expect_equal("start_reduce_scatter_even", even_out, at::arange(r * 4, r * 4 + 4, at::kDouble) * w + rank_sum);
  expect_equal("start_all_reduce_avg", averaged, at::full({2}, (w - 1) / 2.0, at::kFloat));

  // Barrier: ranks arrive staggered; nobody may leave before the last one arrived.
  std::this_thread::sleep_for(std::chrono::milliseconds(100 * (w - 1 - r)));
  at::Tensor times = at::empty({2}, at::kLong);  // [enter, leave] in ns
  times[0] = now_ns();
  comm.barrier();
  times[1] = now_ns();
  at::Tensor all_times = at::empty({w, 2}, at::kLong);  // [w, 2]
  comm.all_gather_into(all_times, times);
  int64_t last_enter = all_times.select(1, 0).max().item<int64_t>();
  int64_t first_leave = all_times.select(1, 1).min().item<int64_t>();
  expect_equal("barrier_waits_for_last_rank", at::tensor({first_leave >= last_enter ? 1 : 0}), at::tensor({1}));
}

// Rank 0's view of a broken peer: the collective must throw; report how long it took.
int run_peer_failure(Communicator& comm, bool peer_exits) {
  if (comm.rank() == 1) {
    if (peer_exits) raise(SIGKILL);  // like a crash: no destructors, sockets closed by the kernel
    std::this_thread::sleep_for(std::chrono::minutes(10));  // the test kills this process
    return 0;
  }
  if (peer_exits) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  at::Tensor tensor = at::ones({4});
  auto start = std::chrono::steady_clock::now();
  try {
    comm.all_reduce(tensor);
  } catch (const dschat::core::Error&) {
    auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    std::cout << "collective_ms=" << elapsed.count() << std::endl;
    throw;
  }
  std::cout << "FAIL all_reduce returned although rank 1 is gone\n";
  return 1;
}

int run_steps(Communicator& comm, int64_t steps) {
  std::cout << "rank " << comm.rank() << " pid " << getpid() << std::endl;
  for (int64_t step = 0; step < steps; ++step) {
    at::Tensor ones = at::ones({4});  // [4]
    comm.all_reduce(ones);
    if (ones[0].item<float>() != static_cast<float>(comm.world_size())) {
      std::cout << "FAIL steps: all_reduce gave " << ones << std::endl;
      return 1;
    }
    std::cout << "rank " << comm.rank() << " step " << step << std::endl;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::cout << "PASS steps" << std::endl;
  return 0;
}

void run_async_gather(Communicator& comm) {
  const int64_t w = comm.world_size();
  const int64_t r = comm.rank();
  at::Tensor in_a = at::full({3}, r, at::kLong);                // [3]
  at::Tensor out_a = at::empty({w * 3}, at::kLong);             // [w * 3]
  at::Tensor in_b = at::arange(2, at::kFloat) + 10 * r;         // [2]
  at::Tensor out_b = at::empty({w, 2}, at::kFloat);             // [w, 2]
  dschat::dist::PendingCollective first = comm.start_all_gather_into(out_a, in_a);
  dschat::dist::PendingCollective second = comm.start_all_gather_into(out_b, in_b);
  at::Tensor sum = at::ones({2});  // a blocking call while both are in flight
  comm.all_reduce(sum);
  second.wait();
  first.wait();
  first.wait();  // no-op
  expect_equal("async_all_gather_first", out_a, at::arange(w, at::kLong).repeat_interleave(3));
  expect_equal("async_all_gather_second", out_b,
               at::arange(2, at::kFloat).unsqueeze(0) + 10 * at::arange(w, at::kFloat).unsqueeze(1));
  expect_equal("blocking_call_between", sum, at::full({2}, static_cast<double>(w), at::kFloat));

  at::Tensor in_c = at::full({1}, r + 1, at::kInt);  // [1]
  at::Tensor out_c = at::empty({w}, at::kInt);       // [w]
  { dschat::dist::PendingCollective unwaited = comm.start_all_gather_into(out_c, in_c); }
  expect_equal("async_all_gather_destroyed_unwaited", out_c, at::arange(1, w + 1, at::kInt));

  at::Tensor out_d = at::empty({w}, at::kInt);  // [w]
  dschat::dist::PendingCollective moved;
  moved = comm.start_all_gather_into(out_d, in_c);
  dschat::dist::PendingCollective target(std::move(moved));
  moved.wait();  // empty after the move: no-op
  target.wait();
  expect_equal("async_all_gather_moved", out_d, at::arange(1, w + 1, at::kInt));
}

void run_subgroups(Communicator& comm) {
  const int64_t r = comm.rank();
  if (comm.world_size() != 4) {
    ++failures;
    std::cout << "FAIL subgroups: needs 4 ranks\n";
    return;
  }
  const int64_t first = r / 2 * 2;  // the pair's first rank
  Communicator pair = comm.subgroup({first, first + 1});
  at::Tensor sum = at::full({3}, static_cast<float>(r), at::kFloat);  // [3]
  pair.all_reduce(sum, ReduceOp::Sum);
  expect_equal("pair_rank_and_size", at::tensor({pair.rank(), pair.world_size()}), at::tensor({r % 2, int64_t{2}}));
  expect_equal("pair_all_reduce", sum, at::full({3}, static_cast<float>(2 * first + 1), at::kFloat));
  at::Tensor world = at::ones({1}, at::kFloat);  // [1]
  comm.all_reduce(world, ReduceOp::Sum);
  expect_equal("world_between", world, at::full({1}, 4.0f, at::kFloat));
  if (r == 1) {
    Communicator alone = comm.subgroup({1});
    at::Tensor own = at::full({2}, 5.0f, at::kFloat);  // [2]
    alone.all_reduce(own, ReduceOp::Sum);
    expect_equal("alone_all_reduce", own, at::full({2}, 5.0f, at::kFloat));
  } else {
    Communicator trio = comm.subgroup({0, 2, 3});
    at::Tensor out = at::empty({3}, at::kInt);                         // [3]
    trio.all_gather_into(out, at::full({1}, static_cast<int>(r), at::kInt));
    expect_equal("trio_gather", out, at::tensor({0, 2, 3}, at::kInt));
    at::Tensor max = at::full({1}, static_cast<float>(r), at::kFloat);  // [1]
    trio.all_reduce(max, ReduceOp::Max);
    expect_equal("trio_all_reduce_max", max, at::full({1}, 3.0f, at::kFloat));
  }
  bool refused = false;
  try {
    comm.subgroup({(r + 1) % 4});
  } catch (const dschat::core::InvalidArgument& e) {
    refused = std::string(e.what()).find("include this rank") != std::string::npos;
  }
  expect_equal("subgroup_without_this_rank_refused", at::tensor({refused ? 1 : 0}), at::tensor({1}));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::cerr << "usage: dschat_dist_worker <collectives|peer_exits|peer_hangs|steps|async_gather|subgroups> <timeout_ms> "
                 "[steps]\n";
    return 2;
  }
  const std::string scenario = argv[1];
  const int64_t timeout_ms = std::stoll(argv[2]);
  try {
    const std::shared_ptr<Communicator> communicator = dschat::worker::join_job(timeout_ms);
    Communicator& comm = *communicator;
    if (scenario == "collectives") {
      run_collectives(comm);
      return failures == 0 ? 0 : 1;
    }
    if (scenario == "peer_exits" || scenario == "peer_hangs") return run_peer_failure(comm, scenario == "peer_exits");
    if (scenario == "steps") return run_steps(comm, argc == 4 ? std::stoll(argv[3]) : 100);
    if (scenario == "subgroups") {
      run_subgroups(comm);
      return failures == 0 ? 0 : 1;
    }
    if (scenario == "async_gather") {
      run_async_gather(comm);
      return failures == 0 ? 0 : 1;
    }
    std::cerr << "unknown scenario " << scenario << "\n";
    return 2;
  } catch (const dschat::core::Error& e) {
    std::cerr << "dschat error: " << e.what() << std::endl;
    return 1;
  }
}
