# The C++ standard keel compiles as: the oldest of 17 and 20 under which the
# libtorch headers compile. Decided by trying, not by a table of releases:
# libtorch 2.14 made ATen/ATen.h '#error' below C++20 (pytorch/pytorch#178150),
# and whatever a later release requires is found the same way.
#
# In:  keel::torch_cpu (KeelTorch.cmake), KEEL_TORCH_ROOT, KEEL_TORCH_VERSION.
# Out: KEEL_CXX_STANDARD (17 or 20), cached per libtorch tree; CMAKE_CXX_STANDARD.

set(_keel_std_key "${KEEL_TORCH_ROOT}@${KEEL_TORCH_VERSION}@${CMAKE_CXX_COMPILER}")
if(NOT KEEL_CXX_STANDARD OR NOT "${_KEEL_CXX_STANDARD_KEY}" STREQUAL "${_keel_std_key}")
  set(_keel_probe_dir "${CMAKE_BINARY_DIR}/CMakeFiles/keel-cxx-standard")
  file(WRITE "${_keel_probe_dir}/probe.cpp"
    "#include <ATen/ATen.h>\nstatic_assert(sizeof(at::Tensor) > 0, \"\");\n")
  get_target_property(_keel_torch_defs keel::torch_cpu INTERFACE_COMPILE_DEFINITIONS)
  unset(_keel_found_std)
  # Compile only: the question is what the headers accept, not what links.
  set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)
  foreach(_std 17 20)
    message(CHECK_START "keel: do the libtorch ${KEEL_TORCH_VERSION} headers compile as C++${_std}")
    try_compile(_keel_std_ok "${_keel_probe_dir}/build-${_std}"
      SOURCES "${_keel_probe_dir}/probe.cpp"
      CMAKE_FLAGS "-DINCLUDE_DIRECTORIES=${KEEL_TORCH_ROOT}/include"
      COMPILE_DEFINITIONS "-D${_keel_torch_defs}"
      CXX_STANDARD ${_std}
      CXX_STANDARD_REQUIRED ON
      CXX_EXTENSIONS OFF
      OUTPUT_VARIABLE _keel_std_out)
    if(_keel_std_ok)
      message(CHECK_PASS "yes")
      set(_keel_found_std ${_std})
      break()
    endif()
    string(REGEX MATCH "#error[^\n]*" _keel_std_why "${_keel_std_out}")
    if(NOT _keel_std_why)
      string(REGEX MATCH "error:[^\n]*" _keel_std_why "${_keel_std_out}")
    endif()
    message(CHECK_FAIL "no (${_keel_std_why})")
  endforeach()
  if(NOT _keel_found_std)
    message(FATAL_ERROR "keel: the libtorch ${KEEL_TORCH_VERSION} headers at ${KEEL_TORCH_ROOT} "
      "compile neither as C++17 nor as C++20 with ${CMAKE_CXX_COMPILER_ID} "
      "${CMAKE_CXX_COMPILER_VERSION}. The last error:\n${_keel_std_out}")
  endif()
  set(KEEL_CXX_STANDARD ${_keel_found_std} CACHE STRING
    "C++ standard keel compiles as (found by compiling ATen/ATen.h)" FORCE)
  set(_KEEL_CXX_STANDARD_KEY "${_keel_std_key}" CACHE INTERNAL "")
endif()
message(STATUS "keel: C++${KEEL_CXX_STANDARD} (the oldest standard the libtorch ${KEEL_TORCH_VERSION} headers accept)")
set(CMAKE_CXX_STANDARD ${KEEL_CXX_STANDARD})
