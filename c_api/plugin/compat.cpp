// keel::compat over C callbacks (keel.h, "compat"): a service's function
// recorded on one release and replayed on another.
#include <algorithm>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "common.h"

namespace keel::c_api {
namespace {

// The service's C function as a keel::compat::Function.
compat::Function compat_function(KEEL_Compat_Function* fn, void* user_data) {
  return [fn, user_data](const compat::Case& c) -> result<compat::Tensors> {
    std::vector<DLManagedTensorVersioned*> owned;
    std::vector<KEEL_NamedTensor> inputs;
    for (const auto& [name, t] : c.inputs) {
      owned.push_back(to_dlpack(t, {}));
      inputs.push_back({name.c_str(), owned.back()});
    }
    constexpr std::size_t kCapacity = 64;
    KEEL_NamedTensor outputs[kCapacity] = {};
    char error[1024] = {0};
    KEEL_Compat_Function_Args args{};
    args.struct_size = KEEL_Compat_Function_Args_STRUCT_SIZE;
    args.user_data = user_data;
    args.case_id = c.id.c_str();
    args.inputs = inputs.data();
    args.num_inputs = inputs.size();
    args.outputs = outputs;
    args.output_capacity = kCapacity;
    args.error = error;
    args.error_capacity = sizeof error;
    const std::int32_t code = fn(&args);
    for (DLManagedTensorVersioned* m : owned) m->deleter(m);
    const std::size_t count = std::min(args.num_outputs, kCapacity);
    compat::Tensors out;
    result<void> bad = success();
    for (std::size_t i = 0; i < count; ++i) {
      const std::string name = outputs[i].name != nullptr ? outputs[i].name : "";
      result<at::Tensor> t = from_dlpack(outputs[i].tensor, "output '" + name + "'");
      if (t && bad) out[name] = t.value().clone();
      if (!t && bad) bad = t.error();
      if (outputs[i].tensor != nullptr && outputs[i].tensor->deleter != nullptr) {
        outputs[i].tensor->deleter(outputs[i].tensor);
      }
    }
    if (code != KEEL_ERRC_OK) {
      error[sizeof error - 1] = '\0';
      const auto errc = code >= KEEL_ERRC_INVALID_ARGUMENT && code <= KEEL_ERRC_CORRUPT_DATA
                            ? static_cast<Errc>(code)
                            : Errc::backend_error;
      return Error(errc, error);
    }
    if (!bad) return bad.error();
    return out;
  };
}

}  // namespace

KEEL_Error* compat_record(KEEL_Compat_Record_Args* args) noexcept {
  return guarded("KEEL_Compat_Record", [&]() -> KEEL_Error* {
    KEEL_TRY(a, sized(args));
    if (a.path == nullptr || a.function == nullptr) {
      return make_error(KEEL_ERRC_INVALID_ARGUMENT, "path and function must not be NULL");
    }
    if (a.num_cases > 0 && a.cases == nullptr) {
      return make_error(KEEL_ERRC_INVALID_ARGUMENT, "cases is NULL with num_cases > 0");
    }
    std::vector<compat::Case> cases;
    for (std::size_t i = 0; i < a.num_cases; ++i) {
      const std::string name = "cases[" + std::to_string(i) + "]";
      KEEL_TRY(c, sized(a.cases[i], name));
      if (c.id == nullptr) return make_error(KEEL_ERRC_INVALID_ARGUMENT, name + ".id is NULL");
      if (c.num_inputs > 0 && c.inputs == nullptr) {
        return make_error(KEEL_ERRC_INVALID_ARGUMENT, name + ".inputs is NULL");
      }
      compat::Case k;
      k.id = c.id;
      for (std::size_t j = 0; j < c.num_inputs; ++j) {
        const std::string input = name + ".inputs[" + std::to_string(j) + "]";
        if (c.inputs[j].name == nullptr) {
          return make_error(KEEL_ERRC_INVALID_ARGUMENT, input + ".name is NULL");
        }
        KEEL_TRY(t, from_dlpack(c.inputs[j].tensor, input));
        k.inputs[c.inputs[j].name] = t;
      }
      if (c.has_tolerance != 0) k.tolerance = compat::Tolerance{c.atol, c.rtol};
      cases.push_back(std::move(k));
    }
    result<void> recorded = compat::record(a.path, cases, compat_function(a.function, a.user_data));
    return recorded ? nullptr : to_c(recorded.error());
  });
}

KEEL_Error* compat_compare(KEEL_Compat_Compare_Args* args) noexcept {
  return guarded("KEEL_Compat_Compare", [&]() -> KEEL_Error* {
    using A = KEEL_Compat_Compare_Args;
    KEEL_TRY(a, sized(args));
    Outputs<A> out(args, &A::passed, &A::failed, &A::skipped, &A::errors);
    if (a.path == nullptr || a.function == nullptr) {
      return make_error(KEEL_ERRC_INVALID_ARGUMENT, "path and function must not be NULL");
    }
    compat::CompareOptions o;
    if (a.repeat > 0) o.repeat = a.repeat;
    if (a.filter != nullptr) o.filter = a.filter;
    KEEL_TRY(report, compat::compare(a.path, compat_function(a.function, a.user_data), o));
    const auto write = [](const char* path, const std::string& text) {
      if (path == nullptr) return true;
      std::ofstream f(path, std::ios::binary);
      f << text;
      return static_cast<bool>(f);
    };
    if (!write(a.json_path, compat::to_json(report)) ||
        !write(a.html_path, compat::to_html(report))) {
      return make_error(KEEL_ERRC_IO_ERROR, "cannot write the report");
    }
    out.set(&A::passed, report.passed);
    out.set(&A::failed, report.failed);
    out.set(&A::skipped, report.skipped);
    out.set(&A::errors, report.errors);
    return out.commit();
  });
}

}  // namespace keel::c_api
