#include "comm/validation.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include "keel/v1/dtype.h"
#include "string_view_bridge.h"
#include "validate.h"

namespace keel {
inline namespace v1 {
namespace comm::detail {

using internal::to_absl;

std::string trailing_text(const at::Tensor& t) {
  auto s = t.sizes().vec();
  if (!s.empty()) s.erase(s.begin());
  return absl::StrCat("[", absl::StrJoin(s, ", "), "]");
}

std::uint64_t nbytes(const at::Tensor& t) {
  return static_cast<std::uint64_t>(t.nbytes());
}

Error invalid(std::string_view op, const std::string& message) {
  return internal::invalid(absl::StrCat("keel::comm::", to_absl(op)), message);
}

result<void> validate_options(const CommOptions& o) {
  auto bad = [](const std::string& m) { return invalid("Communicator::create", m); };
  if (o.timeout.count() <= 0)
    return bad(absl::StrCat("timeout: expected > 0 ms, got ", o.timeout.count()));
  if (o.heartbeat_interval.count() <= 0) {
    return bad(
        absl::StrCat("heartbeat_interval: expected > 0 ms, got ", o.heartbeat_interval.count()));
  }
  if (o.peer_timeout < 2 * o.heartbeat_interval) {
    return bad(absl::StrCat("peer_timeout: expected at least twice heartbeat_interval (",
                            2 * o.heartbeat_interval.count(), " ms), got ", o.peer_timeout.count(),
                            " ms"));
  }
  if (o.flight_recorder_entries < 1) return bad("flight_recorder_entries: expected >= 1, got 0");
  if (o.name.empty() || o.name.find('/') != std::string::npos) {
    return bad(absl::StrCat("name: expected a non-empty name without '/', got \"", o.name, "\""));
  }
  if (o.generation && *o.generation < 0) {
    return bad(absl::StrCat("generation: expected >= 0, got ", *o.generation));
  }
  const auto b = static_cast<int>(o.backend);
  if (b > static_cast<int>(CommBackend::nccl))
    return bad(absl::StrCat("backend: not a CommBackend (", b, ")"));
  if (o.backend == CommBackend::gloo && !o.device.is_cpu()) {
    return bad(
        absl::StrCat("device: backend gloo serves CPU tensors, got device ", o.device.str()));
  }
  if (o.backend == CommBackend::nccl && !o.device.is_cuda()) {
    return bad(
        absl::StrCat("device: backend nccl serves CUDA tensors, got device ", o.device.str()));
  }
  if (!o.device.is_cpu() && !o.device.is_cuda()) {
    return bad(absl::StrCat("device: expected cpu or cuda, got ", o.device.str()));
  }
  return success();
}

// Tensor checks every collective shares.
result<void> check_tensor(const GroupState& g, std::string_view op, std::string_view arg,
                          const at::Tensor& t) {
  if (!t.defined()) return invalid(op, absl::StrCat(to_absl(arg), ": undefined tensor"));
  const at::Device want = g.world->options.device;
  if (t.device().type() != want.type() ||
      (want.has_index() && t.device().index() != want.index())) {
    return invalid(op, absl::StrCat(to_absl(arg), ": expected a tensor on ", want.str(),
                                    " (the communicator's device), got ", t.device().str()));
  }
  if (!t.is_contiguous()) {
    return invalid(op, absl::StrCat(to_absl(arg), ": must be contiguous (", internal::shape_text(t),
                                    " with strides [", absl::StrJoin(t.strides(), ", "), "])"));
  }
  if (t.is_sparse() || t.is_quantized()) {
    return invalid(op, absl::StrCat(to_absl(arg), ": must be a dense tensor"));
  }
  return success();
}

result<void> check_same_dtype(std::string_view op, const at::Tensor& output,
                              const at::Tensor& input) {
  if (output.scalar_type() != input.scalar_type()) {
    return invalid(op, absl::StrCat("output: dtype ", keel::dtype_name(output),
                                    " differs from input's ", keel::dtype_name(input)));
  }
  return success();
}

result<void> check_reduce_op(std::string_view op, ReduceOp reduce, const at::Tensor& t) {
  if (static_cast<int>(reduce) > static_cast<int>(ReduceOp::product)) {
    return invalid(op, absl::StrCat("op: not a ReduceOp (", static_cast<int>(reduce), ")"));
  }
  if (reduce == ReduceOp::avg && !at::isFloatingType(t.scalar_type())) {
    return invalid(op, absl::StrCat("op: avg needs a floating dtype, got ", keel::dtype_name(t)));
  }
  return success();
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:  // sum, then divide: Gloo has no AVG
      return c10d::ReduceOp::SUM;
    case ReduceOp::min:
      return c10d::ReduceOp::MIN;
    case ReduceOp::max:
      return c10d::ReduceOp::MAX;
    case ReduceOp::product:
      return c10d::ReduceOp::PRODUCT;
  }
  return c10d::ReduceOp::SUM;
}

result<void> check_peer(const GroupState& g, std::string_view op, int peer, int tag) {
  if (peer < 0 || peer >= g.size) {
    return invalid(op, absl::StrCat("peer: expected in [0, ", g.size, "), got ", peer));
  }
  if (peer == g.rank) return invalid(op, absl::StrCat("peer: ", peer, " is this rank"));
  if (tag < 0) return invalid(op, absl::StrCat("tag: expected >= 0, got ", tag));
  return success();
}

}  // namespace comm::detail
}  // namespace v1
}  // namespace keel
