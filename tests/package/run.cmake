# Installs this build into a scratch prefix, then configures, builds and
# runs tests/package/consumer against it, as a user would: it asks for C++17
# and must get KEEL_EXPECT_CXX (the standard keel was built as) from keel::keel.
file(REMOVE_RECURSE "${KEEL_WORK_DIR}")
function(run step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "package test: ${step} failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "package test: ${step}: ok\n${out}")
endfunction()

run(install ${CMAKE_COMMAND} --install "${KEEL_BUILD_DIR}" --prefix "${KEEL_WORK_DIR}/prefix")
set(launcher "")
find_program(ccache ccache)
if(ccache)
  set(launcher "-DCMAKE_CXX_COMPILER_LAUNCHER=${ccache}")
endif()
run(configure ${CMAKE_COMMAND} -S "${KEEL_SOURCE_DIR}/tests/package/consumer"
  -B "${KEEL_WORK_DIR}/build" -G "${KEEL_GENERATOR}"
  "-DCMAKE_PREFIX_PATH=${KEEL_WORK_DIR}/prefix" -DCMAKE_BUILD_TYPE=Release
  "-DKEEL_EXPECT_CXX=${KEEL_EXPECT_CXX}" ${launcher})
run(build ${CMAKE_COMMAND} --build "${KEEL_WORK_DIR}/build")
run(run "${KEEL_WORK_DIR}/build/consumer" "${KEEL_EXPECT_TORCH}")
