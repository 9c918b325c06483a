// DLPack <-> at::Tensor inside a keel plugin (include/keel/c/keel.h's
// ownership rules). Written on at::from_blob and the tensor's own sizes,
// strides and data pointer, which every supported release has with one
// meaning, so no release #if is needed here.
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <dlpack/dlpack.h>

#include "keel/v1/error.h"

namespace keel::c_api {

// A borrowed input: an at::Tensor over the caller's memory, in place (no
// copy, no deleter: the caller keeps it alive for the call). `name` names
// the argument in errors. NULL is an undefined tensor when `optional`, else
// invalid_argument.
result<at::Tensor> from_dlpack(const DLManagedTensorVersioned* managed, const std::string& name,
                               bool optional = false);

// A new caller-owned DLPack tensor holding `tensor` (detached, contiguous).
// When it shares memory with one of `inputs` it is copied first: an output
// never aliases an input. NULL for an undefined tensor.
DLManagedTensorVersioned* to_dlpack(const at::Tensor& tensor,
                                    const std::vector<at::Tensor>& inputs);

}  // namespace keel::c_api
