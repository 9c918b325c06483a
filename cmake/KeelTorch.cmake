# Finds a libtorch tree and imports the libraries keel links, without
# TorchConfig.cmake: the PyPI wheels are CUDA builds, and TorchConfig insists
# on a matching CUDA toolkit even for CPU work. keel needs only c10 and
# torch_cpu (plus torch_cuda and c10_cuda with KEEL_WITH_CUDA).
#
# In:  KEEL_TORCH_DIR (a libtorch root: include/, lib/) or Torch_DIR (its
#      share/cmake/Torch), else KEEL_TORCH_RELEASE under KEEL_DEPS_DIR.
# Out: targets keel::torch_c10, keel::torch_cpu (and keel::torch_cuda, see
#      KeelCuda.cmake); KEEL_TORCH_ROOT, KEEL_TORCH_VERSION,
#      KEEL_TORCH_VERSION_MAJOR/_MINOR.

# The supported releases: cmake/torch-releases.txt, the only list (installed
# beside this file). KEEL_SUPPORTED_TORCH_RELEASES holds them oldest first.
file(STRINGS "${CMAKE_CURRENT_LIST_DIR}/torch-releases.txt" _keel_release_lines REGEX "^[0-9]")
set(KEEL_SUPPORTED_TORCH_RELEASES "")
foreach(_line IN LISTS _keel_release_lines)
  string(REGEX MATCH "^[0-9.]+" _line "${_line}")
  list(APPEND KEEL_SUPPORTED_TORCH_RELEASES "${_line}")
endforeach()
list(GET KEEL_SUPPORTED_TORCH_RELEASES 0 KEEL_TORCH_GOLDEN_RELEASE)
list(GET KEEL_SUPPORTED_TORCH_RELEASES -1 KEEL_TORCH_NEWEST_RELEASE)
list(JOIN KEEL_SUPPORTED_TORCH_RELEASES ", " KEEL_SUPPORTED_TORCH)
set(KEEL_TORCH_RELEASE "${KEEL_TORCH_NEWEST_RELEASE}" CACHE STRING
  "libtorch release to use from KEEL_DEPS_DIR (one of cmake/torch-releases.txt)")
if(NOT KEEL_TORCH_RELEASE)
  set(KEEL_TORCH_RELEASE "${KEEL_TORCH_NEWEST_RELEASE}" CACHE STRING "" FORCE)
endif()
if(DEFINED ENV{KEEL_DEPS_DIR})
  set(_keel_default_deps "$ENV{KEEL_DEPS_DIR}")
else()
  set(_keel_default_deps "$ENV{HOME}/.cache/keel")
endif()
set(KEEL_DEPS_DIR "${_keel_default_deps}" CACHE PATH "Where scripts/fetch-deps.sh unpacks libtorch")

if(NOT KEEL_TORCH_DIR AND Torch_DIR)
  get_filename_component(KEEL_TORCH_DIR "${Torch_DIR}/../../.." ABSOLUTE)
endif()
if(NOT KEEL_TORCH_DIR)
  set(KEEL_TORCH_DIR "${KEEL_DEPS_DIR}/libtorch-${KEEL_TORCH_RELEASE}")
endif()
set(KEEL_TORCH_DIR "${KEEL_TORCH_DIR}" CACHE PATH "libtorch root (include/, lib/)" FORCE)

set(_keel_fetch_hint
  "keel supports libtorch ${KEEL_SUPPORTED_TORCH}. Fetch one with "
  "'scripts/fetch-deps.sh ${KEEL_TORCH_RELEASE}' (it unpacks the PyPI torch wheel into "
  "${KEEL_DEPS_DIR}), or point -DKEEL_TORCH_DIR at a libtorch root. Never Debian's "
  "libtorch-dev (1.13).")

# 2.13 moved the version macros to torch/headeronly/version.h; the old path
# still includes it, so read the new one first.
set(_keel_version_header "")
foreach(_h include/torch/headeronly/version.h include/torch/csrc/api/include/torch/version.h)
  if(EXISTS "${KEEL_TORCH_DIR}/${_h}")
    file(STRINGS "${KEEL_TORCH_DIR}/${_h}" _keel_lines REGEX "^#define TORCH_VERSION_(MAJOR|MINOR|PATCH) ")
    if(_keel_lines)
      set(_keel_version_header "${KEEL_TORCH_DIR}/${_h}")
      break()
    endif()
  endif()
endforeach()
if(NOT _keel_version_header)
  message(FATAL_ERROR "keel: no libtorch at '${KEEL_TORCH_DIR}' (no torch/version.h with "
    "TORCH_VERSION_MAJOR). " ${_keel_fetch_hint})
endif()
foreach(_part MAJOR MINOR PATCH)
  string(REGEX MATCH "TORCH_VERSION_${_part} ([0-9]+)" _m "${_keel_lines}")
  set(KEEL_TORCH_VERSION_${_part} "${CMAKE_MATCH_1}")
endforeach()
set(KEEL_TORCH_VERSION "${KEEL_TORCH_VERSION_MAJOR}.${KEEL_TORCH_VERSION_MINOR}.${KEEL_TORCH_VERSION_PATCH}")
# Supported means the same major.minor as a listed release; tested means the
# very release. Older than the oldest is refused; newer than the newest
# configures, with a warning that nobody has run keel's suites on it.
string(REGEX MATCH "^[0-9]+\\.[0-9]+" _keel_minor "${KEEL_TORCH_VERSION}")
string(REGEX MATCH "^[0-9]+\\.[0-9]+" _keel_oldest_minor "${KEEL_TORCH_GOLDEN_RELEASE}")
if(_keel_minor VERSION_LESS _keel_oldest_minor)
  message(FATAL_ERROR "keel: libtorch ${KEEL_TORCH_VERSION} at '${KEEL_TORCH_DIR}' is too old. "
    ${_keel_fetch_hint})
endif()
set(KEEL_TORCH_SUPPORT "untested")
foreach(_r IN LISTS KEEL_SUPPORTED_TORCH_RELEASES)
  if(_r VERSION_EQUAL KEEL_TORCH_VERSION)
    set(KEEL_TORCH_SUPPORT "tested")
  elseif(KEEL_TORCH_SUPPORT STREQUAL "untested" AND _r MATCHES "^${_keel_minor}\\.")
    set(KEEL_TORCH_SUPPORT "supported")
  endif()
endforeach()
if(KEEL_TORCH_SUPPORT STREQUAL "untested")
  message(WARNING "keel: libtorch ${KEEL_TORCH_VERSION} is untested: keel's suites have run on "
    "${KEEL_SUPPORTED_TORCH} (cmake/torch-releases.txt). Run 'scripts/matrix.sh "
    "${KEEL_TORCH_VERSION}' to build and test keel on it, and add it to the list once it passes.")
endif()
set(KEEL_TORCH_ROOT "${KEEL_TORCH_DIR}")
message(STATUS "keel: libtorch ${KEEL_TORCH_VERSION} at ${KEEL_TORCH_ROOT}")

# The wheels since 2.7 are built with the C++11 std::string ABI; read it from
# the library rather than assume it, since a mismatch links but crashes.
execute_process(COMMAND nm -DC "${KEEL_TORCH_ROOT}/lib/libc10.so"
  OUTPUT_VARIABLE _keel_c10_syms ERROR_QUIET)
if(_keel_c10_syms MATCHES "__cxx11")
  set(KEEL_TORCH_CXX11_ABI 1)
else()
  set(KEEL_TORCH_CXX11_ABI 0)
endif()

function(_keel_import name file)
  if(NOT EXISTS "${KEEL_TORCH_ROOT}/lib/${file}")
    message(FATAL_ERROR "keel: ${KEEL_TORCH_ROOT}/lib/${file} is missing. " ${_keel_fetch_hint})
  endif()
  add_library(keel::${name} SHARED IMPORTED GLOBAL)
  set_target_properties(keel::${name} PROPERTIES
    IMPORTED_LOCATION "${KEEL_TORCH_ROOT}/lib/${file}"
    IMPORTED_NO_SONAME FALSE
    INTERFACE_INCLUDE_DIRECTORIES "${KEEL_TORCH_ROOT}/include;${KEEL_TORCH_ROOT}/include/torch/csrc/api/include"
    INTERFACE_COMPILE_DEFINITIONS "_GLIBCXX_USE_CXX11_ABI=${KEEL_TORCH_CXX11_ABI}")
endfunction()

if(NOT TARGET keel::torch_c10)
  _keel_import(torch_c10 libc10.so)
  _keel_import(torch_cpu libtorch_cpu.so)
  set_property(TARGET keel::torch_cpu PROPERTY INTERFACE_LINK_LIBRARIES keel::torch_c10)
  # libtorch_cpu names libcudart/libcupti (see scripts/fetch-deps.sh); let
  # the linker find them beside it.
  set_property(TARGET keel::torch_cpu PROPERTY INTERFACE_LINK_OPTIONS "LINKER:-rpath-link,${KEEL_TORCH_ROOT}/lib")
  if(KEEL_WITH_CUDA)
    include("${CMAKE_CURRENT_LIST_DIR}/KeelCuda.cmake")
  endif()
endif()
