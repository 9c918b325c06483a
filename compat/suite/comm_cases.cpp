// The communicator family: a 2-rank set of all_reduce (sum, avg, max),
// all_gather, reduce_scatter (sum) and broadcast, float32 and bfloat16 (and
// int64 for the sums), small odd sizes. Each rank's input is drawn at record
// time and stored; a run starts two ranks (suite/rank_workers.h), each
// runs the collective through keel::comm on its stored input. The case's
// outputs are both ranks' results, "rank0" and "rank1".
#include <algorithm>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include "keel/v1/comm.h"
#include "suite/rank_workers.h"
#include "suite/suite.h"

namespace keel::harness {
namespace {

constexpr int kRanks = 2;

std::string rank_name(int r) {
  return absl::StrCat("rank", r);
}

result<comm::ReduceOp> parse_reduce(const std::string& name) {
  if (name == "sum") return comm::ReduceOp::sum;
  if (name == "avg") return comm::ReduceOp::avg;
  if (name == "max") return comm::ReduceOp::max;
  if (name == "min") return comm::ReduceOp::min;
  if (name == "product") return comm::ReduceOp::product;
  return Error(Errc::invalid_argument, absl::StrCat("comm: reduce op '", name,
                                                    "'; expected sum, avg, min, max or product"));
}

// One collective on `input` through `comm`; the rank's result.
result<at::Tensor> run_collective(comm::Communicator& comm, const nlohmann::json& options,
                                  const at::Tensor& input) {
  const std::string op = options.value("op", "");
  if (op == "all_reduce" || op == "reduce_scatter") {
    auto reduce = parse_reduce(options.value("reduce", "sum"));
    if (!reduce) return reduce.error();
    if (op == "all_reduce") {
      at::Tensor t = input.clone();
      auto r = comm.all_reduce(t, reduce.value());
      if (!r) return r.error();
      return t;
    }
    if (input.dim() == 0 || input.size(0) % comm.size() != 0) {
      return Error(Errc::corrupt_data,
                   absl::StrCat("comm: reduce_scatter's stored input has ", input.dim(),
                                " dims and leading size ", input.dim() ? input.size(0) : 0,
                                "; expected a leading size divisible by ", comm.size()));
    }
    std::vector<std::int64_t> shape = input.sizes().vec();
    shape[0] /= comm.size();
    at::Tensor out = at::empty(shape, input.options());
    auto r = comm.reduce_scatter(out, input, reduce.value());
    if (!r) return r.error();
    return out;
  }
  if (op == "all_gather") {
    if (input.dim() == 0) {
      return Error(Errc::corrupt_data, "comm: all_gather's stored input is a scalar");
    }
    std::vector<std::int64_t> shape = input.sizes().vec();
    shape[0] *= comm.size();
    at::Tensor out = at::empty(shape, input.options());
    auto r = comm.all_gather(out, input);
    if (!r) return r.error();
    return out;
  }
  if (op == "broadcast") {
    at::Tensor t = input.clone();
    auto r = comm.broadcast(t, options.value("root", 0));
    if (!r) return r.error();
    return t;
  }
  return Error(Errc::corrupt_data,
               absl::StrCat("comm: operation '", op,
                            "'; expected all_reduce, all_gather, reduce_scatter or broadcast"));
}

class CommFamily final : public Family {
 public:
  std::string operation() const override { return "comm"; }

  std::vector<Case> make_cases() const override {
    std::vector<Case> cases;
    at::manual_seed(20261206);
    struct Spec {
      const char* name;
      nlohmann::json options;
      std::vector<std::int64_t> shape;  // each rank's input
      bool with_int64;
    };
    const Spec specs[] = {
        {"all_reduce_sum", {{"op", "all_reduce"}, {"reduce", "sum"}}, {13}, true},
        {"all_reduce_avg", {{"op", "all_reduce"}, {"reduce", "avg"}}, {3, 5}, false},
        {"all_reduce_max", {{"op", "all_reduce"}, {"reduce", "max"}}, {7}, false},
        {"all_gather", {{"op", "all_gather"}}, {5, 3}, false},
        {"reduce_scatter_sum", {{"op", "reduce_scatter"}, {"reduce", "sum"}}, {14, 3}, true},
        {"broadcast_root1", {{"op", "broadcast"}, {"root", 1}}, {11}, false},
    };
    const std::pair<at::ScalarType, const char*> dtypes[] = {
        {at::kFloat, "float32"}, {at::kBFloat16, "bfloat16"}, {at::kLong, "int64"}};
    for (const auto& [type, dtype] : dtypes) {
      for (const Spec& s : specs) {
        if (type == at::kLong && !s.with_int64) continue;
        Case c;
        c.id = absl::StrCat("comm/", dtype, "/", s.name);
        c.operation = operation();
        c.dtype = dtype;
        c.options = s.options;
        c.options["ranks"] = kRanks;
        for (int r = 0; r < kRanks; ++r) {
          c.inputs[rank_name(r)] = type == at::kLong
                                       ? at::randint(-1000, 1000, s.shape, at::kLong)
                                       : (at::randn(s.shape, at::kDouble) * 4).to(type);
        }
        // With two ranks every output is a copy or one correctly rounded
        // operation per element (a + b, then avg's exact halving), the same
        // in any order and on any release: a difference is a bug, not
        // summation order, so the case is judged exactly.
        c.tolerance = Tolerance{0, 0};
        cases.push_back(std::move(c));
      }
    }
    return cases;
  }

  result<Run> run(const Case& c, Backend backend) const override {
    const int ranks = c.options.value("ranks", kRanks);
    if (ranks != kRanks) {
      return Error(Errc::corrupt_data, absl::StrCat("comm: case ", c.id, " has ", ranks,
                                                    " ranks; keel-compat runs ", kRanks));
    }
    for (int r = 0; r < kRanks; ++r) {
      if (c.inputs.count(rank_name(r)) == 0) {
        return Error(Errc::corrupt_data, absl::StrCat("comm: case ", c.id, " has no stored input '",
                                                      rank_name(r), "'"));
      }
    }
    // Collectives need the same shape and dtype on every rank; checked here,
    // since a mismatch inside Gloo is a wait until the timeout.
    const at::Tensor& first = c.inputs.at(rank_name(0));
    for (int r = 1; r < kRanks; ++r) {
      const at::Tensor& t = c.inputs.at(rank_name(r));
      if (t.sizes() != first.sizes() || t.scalar_type() != first.scalar_type()) {
        return Error(
            Errc::corrupt_data,
            absl::StrCat("comm: case ", c.id, ": stored input '", rank_name(r), "' is ",
                         c10::toString(t.scalar_type()), " of shape [",
                         absl::StrJoin(t.sizes(), ","), "], rank0's is ",
                         c10::toString(first.scalar_type()), " of shape [",
                         absl::StrJoin(first.sizes(), ","), "]; every rank needs the same"));
      }
    }
    std::vector<std::map<std::string, at::Tensor>> inputs(kRanks);
    for (int r = 0; r < kRanks; ++r) inputs[r]["input"] = c.inputs.at(rank_name(r));
    result<std::vector<RankRun>> ran = run_on_ranks(c, inputs, backend);
    if (!ran) return ran.error();
    Run run;
    for (int r = 0; r < kRanks; ++r) {
      const RankRun& rank = ran.value()[r];
      const auto t = rank.outputs.find("output");
      if (t == rank.outputs.end()) {
        return Error(Errc::corrupt_data,
                     absl::StrCat("comm: case ", c.id, ": rank ", r, " wrote no output"));
      }
      run.outputs[rank_name(r)] = t->second;
      // The collective ends when its slowest rank does.
      run.forward_ms = std::max(run.forward_ms, rank.ms);
      run.peak_bytes = std::max(run.peak_bytes, rank.peak_bytes);
    }
    run.adapter = ran.value()[0].adapter;
    return run;
  }

  result<Run> run_rank(comm::Communicator& group, const Case& c,
                       Backend /*backend*/) const override {
    const auto input = c.inputs.find("input");
    if (input == c.inputs.end()) {
      return Error(Errc::corrupt_data, absl::StrCat("comm: case ", c.id, " has no input"));
    }
    result<at::Tensor> output = run_collective(group, c.options, input->second);
    if (!output) return output.error();
    Run run;
    run.outputs["output"] = std::move(output).value();
    run.adapter = group.dispatch_info().adapter;
    return run;
  }
};

}  // namespace

std::unique_ptr<Family> make_comm_family() {
  return std::make_unique<CommFamily>();
}

}  // namespace keel::harness
