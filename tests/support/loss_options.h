// One row of the fused loss's option table and the float64 inputs it makes,
// shared by the conformance suite (tests/conformance/
// linear_cross_entropy_test.cpp) and the vocabulary-parallel ranks
// (tests/distributed/vocab_parallel_worker.cpp), so that both read the same
// options the same way.
#pragma once

#include <cstdint>

#include <ATen/ATen.h>

#include "keel/v1/loss.h"
#include "reference/linear_cross_entropy_reference.h"

namespace keel::testing {

struct LossOptionRow {
  const char* name;
  Reduction reduction;
  std::int64_t ignore_index;  // -100 is absent from the targets unless ignored_share > 0
  double ignored_share;       // the share of targets set to ignore_index
  double label_smoothing;
  bool class_weights;
  bool bias;
  double logit_softcap;
  double z_loss;
  std::int64_t tokens;
  std::int64_t vocab;
};

// The inputs of a row in float64; a test rounds them to the dtype under
// test and gives the reference the rounded values.
struct LossInputs {
  at::Tensor hidden;  // [N, D]
  at::Tensor weight;  // [V, D], scaled by weight_scale
  at::Tensor target;  // [N]
  at::Tensor class_weights;
  at::Tensor bias;
};

// From the current generator, in this order: hidden, weight, target, the
// ignored targets, class weights, bias.
inline LossInputs make_loss_inputs(const LossOptionRow& r, std::int64_t dim, double weight_scale) {
  LossInputs in;
  in.hidden = at::randn({r.tokens, dim}, at::kDouble);
  in.weight = at::randn({r.vocab, dim}, at::kDouble) * weight_scale;
  in.target = at::randint(0, r.vocab, {r.tokens}, at::kLong);
  if (r.ignored_share > 0) {
    const at::Tensor drop = at::rand({r.tokens}, at::kDouble) < r.ignored_share;
    in.target.masked_fill_(drop, r.ignore_index);
  }
  if (r.class_weights) in.class_weights = at::rand({r.vocab}, at::kDouble) * 2 + 0.1;
  if (r.bias) in.bias = at::randn({r.vocab}, at::kDouble);
  return in;
}

// The reference's case for a row and its inputs.
inline reference::LinearCrossEntropyCase reference_case(const LossOptionRow& r,
                                                        const LossInputs& in) {
  reference::LinearCrossEntropyCase c;
  c.reduction = r.reduction;
  c.ignore_index = r.ignore_index;
  c.label_smoothing = r.label_smoothing;
  c.class_weights = in.class_weights;
  c.bias = in.bias;
  c.z_loss = r.z_loss;
  c.logit_softcap = r.logit_softcap;
  return c;
}

}  // namespace keel::testing
