// The second kind of service (docs/c-api.md): one whose own torch work goes
// only through PyTorch's stable C shim, so that the process's libtorch is its
// and the plugin's alike. It makes its tensors with aoti_torch_* calls,
// hands them to keel as DLPack views, and checks keel's attention against a
// float64 softmax computed here. Usage: keel_stable_shim_service PLUGIN
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <torch/csrc/inductor/aoti_torch/c/shim.h>

#include "keel/c/keel.hpp"

namespace {

// A float32 [1, 1, n, 4] tensor made by libtorch through the C shim, filled
// with `values`, and a DLPack view of its memory.
struct ShimTensor {
  AtenTensorHandle handle = nullptr;
  float* data = nullptr;
  ~ShimTensor() {
    if (handle != nullptr) aoti_torch_delete_tensor_object(handle);
  }
};

bool make(ShimTensor& t, std::int64_t n, const std::vector<float>& values) {
  const std::int64_t sizes[4] = {1, 1, n, 4};
  const std::int64_t strides[4] = {4 * n, 4 * n, 4, 1};
  if (aoti_torch_empty_strided(4, sizes, strides, aoti_torch_dtype_float32(),
                               aoti_torch_device_type_cpu(), 0, &t.handle) != AOTI_TORCH_SUCCESS) {
    return false;
  }
  void* p = nullptr;
  if (aoti_torch_get_data_ptr(t.handle, &p) != AOTI_TORCH_SUCCESS) return false;
  t.data = static_cast<float*>(p);
  for (std::size_t i = 0; i < values.size(); ++i) t.data[i] = values[i];
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: keel_stable_shim_service PLUGIN\n");
    return 2;
  }
  keel::c::LoadOptions o;
  o.plugin_path = argv[1];
  keel::c::Result<keel::c::Plugin> plugin = keel::c::Plugin::load(o);
  if (!plugin) {
    std::fprintf(stderr, "keel_stable_shim_service: %s\n", plugin.error().message().c_str());
    return 1;
  }
  const std::vector<float> q = {0.5F, -1, 0.25F, 2, 1, 0, -0.5F, 0.75F};
  const std::vector<float> k = {1, 0.5F, -1, 0, 0.25F, 0.25F, 1, -2, -1, 1, 0.5F, 0.5F};
  const std::vector<float> v = {1, 2, 3, 4, -1, 0, 1, 0, 0.5F, 0.5F, -2, 3};
  ShimTensor tq, tk, tv;
  if (!make(tq, 2, q) || !make(tk, 3, k) || !make(tv, 3, v)) {
    std::fprintf(stderr, "keel_stable_shim_service: the C shim made no tensor\n");
    return 1;
  }
  const DLDataType f32{kDLFloat, 32, 1};
  keel::c::Tensor cq = keel::c::Tensor::view(tq.data, f32, {1, 1, 2, 4}, true);
  keel::c::Tensor ck = keel::c::Tensor::view(tk.data, f32, {1, 1, 3, 4}, true);
  keel::c::Tensor cv = keel::c::Tensor::view(tv.data, f32, {1, 1, 3, 4}, true);
  keel::c::Result<keel::c::AttentionResult> r = plugin.value().attention(cq, ck, cv, nullptr);
  if (!r) {
    std::fprintf(stderr, "keel_stable_shim_service: %s\n", r.error().message().c_str());
    return 1;
  }
  const float* out = r.value().out.data<float>();
  double worst = 0;
  for (int i = 0; i < 2; ++i) {
    double s[3], m = -1e300, z = 0;
    for (int j = 0; j < 3; ++j) {
      s[j] = 0;
      for (int e = 0; e < 4; ++e) s[j] += double(q[i * 4 + e]) * k[j * 4 + e] / 2;  // 1/sqrt(4)
      m = std::fmax(m, s[j]);
    }
    for (double& x : s) z += (x = std::exp(x - m));
    for (int e = 0; e < 4; ++e) {
      double want = 0;
      for (int j = 0; j < 3; ++j) want += s[j] / z * v[j * 4 + e];
      worst = std::fmax(worst, std::fabs(want - out[i * 4 + e]));
    }
  }
  std::printf("keel_stable_shim_service: libtorch shared with the plugin, max error %.3g\n", worst);
  return worst <= 1e-5 ? 0 : 1;
}
