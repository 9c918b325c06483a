# keel's CUDA targets, included by KeelTorch.cmake under KEEL_WITH_CUDA once
# keel::torch_c10 and keel::torch_cpu exist.
#
# Out: keel::torch_c10_cuda and keel::torch_cuda (compile definition
#      USE_C10D_NCCL, the CUDA runtime's and NCCL's include directories, as
#      torch's own Caffe2Targets.cmake exports them, so that a ProcessGroupNCCL
#      user compiles); KEEL_CUDA_INCLUDE_DIR, KEEL_NCCL_INCLUDE_DIR,
#      KEEL_CUDA_LIBRARY_DIRS.
#
# Two layouts are served. A libtorch unpacked from the wheel (scripts/
# fetch-deps.sh) beside a CUDA toolkit: headers and the libraries that
# libtorch_cuda.so names come from the toolkit. A python3 torch install: its
# siblings site-packages/nvidia/*/{include,lib} (the nvidia-* wheels) hold
# them, and are preferred, since they are the versions torch was built with.

get_filename_component(_keel_site "${KEEL_TORCH_ROOT}/.." ABSOLUTE)
file(GLOB _keel_nvidia_include_dirs LIST_DIRECTORIES true "${_keel_site}/nvidia/*/include")
file(GLOB _keel_nvidia_lib_dirs LIST_DIRECTORIES true "${_keel_site}/nvidia/*/lib")

# The toolkit is optional when the nvidia wheels are there (a GPU machine
# with pip's torch needs no nvcc).
find_package(CUDAToolkit QUIET)

find_path(KEEL_CUDA_INCLUDE_DIR cuda_runtime_api.h
  HINTS ${_keel_nvidia_include_dirs} ${CUDAToolkit_INCLUDE_DIRS}
  NO_DEFAULT_PATH)
find_path(KEEL_NCCL_INCLUDE_DIR nccl.h
  HINTS ${_keel_nvidia_include_dirs} ${CUDAToolkit_INCLUDE_DIRS} /usr/include
  NO_DEFAULT_PATH)
if(NOT KEEL_CUDA_INCLUDE_DIR)
  message(FATAL_ERROR "keel: KEEL_WITH_CUDA=ON, but no cuda_runtime_api.h was found: install "
    "a CUDA toolkit whose major version matches libtorch's libcudart (see "
    "'readelf -d ${KEEL_TORCH_ROOT}/lib/libc10_cuda.so'), or use a torch with the nvidia-* "
    "wheels beside it (site-packages/nvidia/*/include).")
endif()
if(NOT KEEL_NCCL_INCLUDE_DIR)
  message(FATAL_ERROR "keel: KEEL_WITH_CUDA=ON, but no nccl.h was found (in the CUDA toolkit, "
    "/usr/include or site-packages/nvidia/nccl/include); c10d's NCCL headers need it.")
endif()

# libtorch_cuda.so names cuBLAS, cuDNN, NCCL, cuSPARSELt, NVSHMEM, cuFile and
# more as NEEDED; linking an executable makes ld resolve them, so it must be
# told where they are (-rpath-link: a link-time search path, not a runtime one).
set(KEEL_CUDA_LIBRARY_DIRS ${_keel_nvidia_lib_dirs})
if(CUDAToolkit_LIBRARY_DIR)
  list(APPEND KEEL_CUDA_LIBRARY_DIRS "${CUDAToolkit_LIBRARY_DIR}")
endif()
set(_keel_rpath_link "${KEEL_TORCH_ROOT}/lib")
foreach(_d IN LISTS KEEL_CUDA_LIBRARY_DIRS)
  string(APPEND _keel_rpath_link ":${_d}")
endforeach()

# The CUDA major version of the toolkit must be libtorch's (libcudart.so.N).
execute_process(COMMAND readelf -d "${KEEL_TORCH_ROOT}/lib/libc10_cuda.so"
  OUTPUT_VARIABLE _keel_c10_cuda_dynamic ERROR_QUIET)
string(REGEX MATCH "libcudart\\.so\\.([0-9]+)" _keel_cudart "${_keel_c10_cuda_dynamic}")
set(KEEL_TORCH_CUDA_MAJOR "${CMAKE_MATCH_1}")
if(CUDAToolkit_FOUND AND KEEL_TORCH_CUDA_MAJOR AND NOT _keel_nvidia_include_dirs
   AND NOT CUDAToolkit_VERSION_MAJOR STREQUAL KEEL_TORCH_CUDA_MAJOR)
  message(FATAL_ERROR "keel: libtorch at ${KEEL_TORCH_ROOT} is built for CUDA "
    "${KEEL_TORCH_CUDA_MAJOR} (libcudart.so.${KEEL_TORCH_CUDA_MAJOR}), but the CUDA toolkit "
    "found is ${CUDAToolkit_VERSION}.")
endif()

_keel_import(torch_c10_cuda libc10_cuda.so)
_keel_import(torch_cuda libtorch_cuda.so)
set_property(TARGET keel::torch_c10_cuda APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES
  "${KEEL_CUDA_INCLUDE_DIR}")
set_property(TARGET keel::torch_c10_cuda PROPERTY INTERFACE_LINK_LIBRARIES keel::torch_c10)
set_property(TARGET keel::torch_cuda APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES
  "${KEEL_CUDA_INCLUDE_DIR}" "${KEEL_NCCL_INCLUDE_DIR}")
set_property(TARGET keel::torch_cuda APPEND PROPERTY INTERFACE_COMPILE_DEFINITIONS USE_C10D_NCCL)
set_property(TARGET keel::torch_cuda PROPERTY INTERFACE_LINK_LIBRARIES
  "keel::torch_cpu;keel::torch_c10_cuda")

# Can an executable link against libtorch_cuda.so here? Not when a library it
# names is missing (the CUDA 13 toolkit ships no cuSPARSELt, NVSHMEM or
# cuFile) or older than torch's (the toolkit's NCCL lacks symbols of the NCCL
# the wheel pins). Then ld is told to leave libtorch_cuda's own undefined
# symbols to the loader: the binaries build (CI's build-only check) but load
# only where those libraries exist. libkeel itself links with --no-undefined
# (CMakeLists.txt), so keel's own references are still checked.
if(NOT DEFINED KEEL_CUDA_LINK_COMPLETE)
  set(_keel_probe_dir "${CMAKE_BINARY_DIR}/CMakeFiles/keel-cuda-link-probe")
  file(WRITE "${_keel_probe_dir}/main.cpp" "int main() { return 0; }\n")
  try_compile(_keel_cuda_link_ok "${_keel_probe_dir}/build" "${_keel_probe_dir}/main.cpp"
    LINK_OPTIONS "LINKER:--no-as-needed" "LINKER:-rpath-link,${_keel_rpath_link}"
    LINK_LIBRARIES "${KEEL_TORCH_ROOT}/lib/libtorch_cuda.so" "${KEEL_TORCH_ROOT}/lib/libc10_cuda.so"
      "${KEEL_TORCH_ROOT}/lib/libtorch_cpu.so" "${KEEL_TORCH_ROOT}/lib/libc10.so"
    OUTPUT_VARIABLE _keel_probe_log)
  string(REGEX MATCHALL "lib[A-Za-z0-9_]+\\.so\\.[0-9]+, needed by [^,]+, not found"
    _keel_missing "${_keel_probe_log}")
  list(TRANSFORM _keel_missing REPLACE ", needed by [^,]+, not found" "")
  list(REMOVE_DUPLICATES _keel_missing)
  set(KEEL_CUDA_LINK_COMPLETE ${_keel_cuda_link_ok} CACHE BOOL
    "Whether executables link against libtorch_cuda.so with every library it names")
  set(KEEL_CUDA_MISSING_LIBS "${_keel_missing}" CACHE STRING
    "Libraries libtorch_cuda.so names that the link probe did not find")
endif()
set(_keel_cuda_link_options "LINKER:-rpath-link,${_keel_rpath_link}")
if(NOT KEEL_CUDA_LINK_COMPLETE)
  message(STATUS "keel: executables link against libtorch_cuda.so with --allow-shlib-undefined: "
    "missing here: ${KEEL_CUDA_MISSING_LIBS} (or older, e.g. NCCL); they build but load only "
    "where torch's own CUDA libraries are (a python3 torch's site-packages/nvidia)")
  list(APPEND _keel_cuda_link_options "LINKER:--allow-shlib-undefined")
endif()
set_property(TARGET keel::torch_cuda PROPERTY INTERFACE_LINK_OPTIONS ${_keel_cuda_link_options})
message(STATUS "keel: CUDA ${KEEL_TORCH_CUDA_MAJOR} headers at ${KEEL_CUDA_INCLUDE_DIR}, "
  "NCCL at ${KEEL_NCCL_INCLUDE_DIR}")
