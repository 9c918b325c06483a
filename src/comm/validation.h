// The communicator's argument checks, each an Errc::invalid_argument
// naming the operation and the argument: options, tensors, reduce ops,
// peers. Every check runs before anything is issued, on this rank alone.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "comm/state.h"
#include "keel/v1/comm.h"
#include "keel/v1/error.h"
#include "validate.h"

namespace keel {
inline namespace v1 {
namespace comm::detail {

// "[3]": the dims after the first (all_to_all splits rows).
std::string trailing_text(const at::Tensor& t);
std::uint64_t nbytes(const at::Tensor& t);
// invalid_argument, "keel::comm::<op>: <message>".
Error invalid(std::string_view op, const std::string& message);

result<void> validate_options(const CommOptions& o);
// Defined, on the communicator's device, contiguous and dense.
result<void> check_tensor(const GroupState& g, std::string_view op, std::string_view arg,
                          const at::Tensor& t);
result<void> check_same_dtype(std::string_view op, const at::Tensor& output,
                              const at::Tensor& input);
// A ReduceOp, and avg only on a floating dtype.
result<void> check_reduce_op(std::string_view op, ReduceOp reduce, const at::Tensor& t);
// A peer of this group other than this rank, and a tag >= 0.
result<void> check_peer(const GroupState& g, std::string_view op, int peer, int tag);
// avg is sum, then a division (Gloo has no AVG).
c10d::ReduceOp to_c10d(ReduceOp op);

}  // namespace comm::detail
}  // namespace v1
}  // namespace keel
