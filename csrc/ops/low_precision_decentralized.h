// Low-precision decentralized SGD: after the
// optimizer step, each rank moves its weights towards the average of its ring
// neighbours, sending only MinMaxUInt8-compressed differences.
//
// data = this rank's weights after the local optimizer step (x_{t+1/2}), in
// place. State (ops/algorithm_step.h), three spans initialised with the weights:
//   W = my replica, L = replica of my left peer, R = replica of my right peer.
// Step number s communicates when s % communication_interval == 0; then, on a
// communicator of n ranks, rank r, left = (r - 1 + n) mod n, right = (r + 1) mod n:
//   1. data <- data + L/3 + R/3 - W*(5/3)        (ReplicaMath, ops/elementwise.h)
//   2. Q <- compress(data) with one chunk (kernels/minmax_uint8.h)
//   3. Q goes to left and right; Q_left, Q_right come back (n = 2: Q travels
//      once to the one peer, whose Q is both Q_left and Q_right; n = 1: my own Q)
//   4. L <- L + decompress(Q_left); R <- R + decompress(Q_right)
//   5. data <- W + decompress(Q); W <- data
// Every rank adds the same decoded values, so L and R equal the neighbours'
// W exactly. Hierarchical: the node leader reduces (AVG) the node's weights,
// runs the above among leaders (n = number of nodes; non-leaders' state is
// unused), and broadcasts the result to its node.
// Step 5 runs while Q travels (ops/alongside.h): it reads only my Q, W and data.
// Scratch slots: 0 my Q (twice when n != 2), 1 the neighbours' Q, 2 a decoded
// neighbour difference, 3 my decoded difference.
//
// Registered as "low_precision_decentralized"; parameters: hierarchical (bool,
// false), communication_interval (int >= 1, 1).
#pragma once

#include <cstdint>
#include <string>

#include "ops/algorithm_step.h"

namespace bagua {

class LowPrecisionDecentralizedStep : public Step {
 public:
  static constexpr int kState = 3;  // W, L, R

  LowPrecisionDecentralizedStep(CommSet comms, const StepParams& params);
  std::string describe() const override;
  void check(DType dtype, size_t count) const override;
  bool communicates(int64_t step) const override { return step % interval_ == 0; }
  int num_state() const override { return kState; }
  // Throws InvalidArgument: the step needs its state (run_with_state).
  bool run(const ExecContext& ctx, Span data, Span result, int64_t step) const override;
  bool run_with_state(const ExecContext& ctx, Span data, Span result, const std::vector<Span>& state,
                      int64_t step) const override;

 private:
  void ring(Communicator& c, const ExecContext& ctx, Span data, const std::vector<Span>& state) const;

  CommSet comms_;
  int64_t interval_;
  bool hierarchical_;
};

}  // namespace bagua
