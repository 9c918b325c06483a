// What one kernel serves, as a value. The dispatcher asks it (through the
// kernel's supports()) and keel-info prints it (through AdapterInfo), so the
// two read one object and cannot disagree.
#pragma once

#include <algorithm>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include "keel/v1/build_info.h"
#include "keel/v1/dtype.h"

namespace keel::internal {

// A kernel's answer to "can you serve this call?", with the reason when not.
struct Support {
  bool ok = true;
  std::string reason;

  static Support yes() { return {}; }
  static Support no(std::string why) { return {false, std::move(why)}; }
};

// The options a call may need that a kernel may lack, by the name
// Capability::features lists them under.
inline constexpr const char* kFeatureMask = "mask";

struct Capability {
  // The operation, as keel names it ("logsumexp").
  std::string operation;
  // What it serves: every call is of one of these dtypes and device types.
  std::vector<c10::ScalarType> dtypes;
  std::vector<c10::DeviceType> devices;
  // What it serves beyond the plain call, in words; a call that needs one
  // of the kFeature* names is served only when it is listed here.
  std::vector<std::string> features;
  // What it runs on, in a sentence.
  std::string implementation;
  // Non-empty: the kernel serves no call, and this is why.
  std::string declined;

  // Whether a call of `dtype` on `device` that needs `needs` is served.
  Support admits(c10::ScalarType dtype, c10::DeviceType device,
                 std::initializer_list<const char*> needs = {}) const {
    if (!declined.empty()) return Support::no(declined);
    if (std::find(dtypes.begin(), dtypes.end(), dtype) == dtypes.end()) {
      return Support::no(operation + " here serves no " + dtype_name(dtype) + " (" +
                         implementation + ")");
    }
    if (std::find(devices.begin(), devices.end(), device) == devices.end()) {
      return Support::no(operation + " here serves no " + c10::DeviceTypeName(device, true) +
                         " tensors (" + implementation + ")");
    }
    for (const char* need : needs) {
      if (std::find(features.begin(), features.end(), need) == features.end()) {
        return Support::no(operation + " here serves no " + need + " (" + implementation + ")");
      }
    }
    return Support::yes();
  }

  // The public form, for AdapterInfo and keel-info. A declined capability
  // lists nothing served and says why in `implementation`.
  CapabilityInfo info() const {
    CapabilityInfo c;
    c.operation = operation;
    if (!declined.empty()) {
      c.implementation = "none: " + declined;
      return c;
    }
    for (c10::ScalarType t : dtypes) c.dtypes.push_back(dtype_name(t));
    for (c10::DeviceType d : devices) c.devices.push_back(c10::DeviceTypeName(d, true));
    c.features = features;
    c.implementation = implementation;
    return c;
  }

  // A kernel that serves every floating dtype keel takes (float16,
  // bfloat16, float32, float64) on CPU and CUDA tensors.
  static Capability floating(std::string operation, std::vector<std::string> features,
                             std::string implementation) {
    Capability c;
    c.operation = std::move(operation);
    c.dtypes = {c10::kHalf, c10::kBFloat16, c10::kFloat, c10::kDouble};
    c.devices = {c10::DeviceType::CPU, c10::DeviceType::CUDA};
    c.features = std::move(features);
    c.implementation = std::move(implementation);
    return c;
  }

  // A capability that serves nothing, for `reason`.
  static Capability none(std::string operation, std::string reason) {
    Capability c;
    c.operation = std::move(operation);
    c.declined = std::move(reason);
    return c;
  }
};

}  // namespace keel::internal
