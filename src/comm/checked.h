// Checked mode (CommOptions::checked, KEEL_COMM_CHECK=1): before an
// operation is issued, every rank posts a typed description of its call to
// the store and reads everyone's; a disagreement is an invalid_argument on
// every rank (the same message), and nothing is issued, so the group stays
// usable.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/state.h"
#include "keel/v1/error.h"

namespace keel {
inline namespace v1 {
namespace comm::detail {

// What one rank says of its call.
struct Descriptor {
  // What every rank must say alike, e.g. "float32 [4, 8](sum)".
  std::string call;
  // all_to_all with split sizes: the ranks agree on dtype and trailing
  // dims, and what rank i sends to j is what j expects from i.
  bool pairwise = false;
  std::string dtype;
  std::vector<std::int64_t> trailing;
  std::vector<std::int64_t> input_splits;   // rows this rank sends to each rank
  std::vector<std::int64_t> output_splits;  // rows this rank expects from each rank
};

// The descriptor of a call on `t`, "<dtype> <shape><detail>".
Descriptor describe_tensor_call(const at::Tensor& t, const std::string& detail = {});
// The descriptor of all_to_all with split sizes.
Descriptor pairwise(const at::Tensor& input, const std::vector<std::int64_t>& input_splits,
                    const std::vector<std::int64_t>& output_splits);

// The store's form of a descriptor (JSON), and back; nullopt for anything
// that is not one.
std::string encode(const Descriptor& d);
std::optional<Descriptor> decode(const std::string& text);

// What the ranks' descriptors (one per rank, nullopt where a rank posted
// something else) disagree on, in a sentence; empty when they agree. Every
// rank reads the same descriptors and so writes the same sentence.
std::string disagreement(const std::vector<std::optional<Descriptor>>& all, int size);

// Every rank posts its descriptor of operation `seq`; all must agree.
result<void> check_metadata(GroupState& g, std::uint64_t seq, const std::string& what,
                            const Descriptor& mine, Clock::time_point deadline);

}  // namespace comm::detail
}  // namespace v1
}  // namespace keel
