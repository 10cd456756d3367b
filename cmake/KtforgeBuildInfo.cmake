# Target ISA flags for the native extension.
#
# KTFORGE_ARCH_FLAGS defaults to -march=native: the extension is built for the
# machine it is built on. Later recipes pass explicit flags instead; whatever is
# used is compiled into the extension (see build_info()) so that what it needs
# can be checked against the CPU that loads it.
set(KTFORGE_ARCH_FLAGS "-march=native" CACHE STRING "ISA flags for the native kernels")

include(CheckCXXCompilerFlag)
function(ktforge_apply_arch_flags target)
  separate_arguments(_flags UNIX_COMMAND "${KTFORGE_ARCH_FLAGS}")
  set(CMAKE_REQUIRED_QUIET ON)
  string(REPLACE ";" " " _joined "${_flags}")
  check_cxx_compiler_flag("${_joined}" KTFORGE_ARCH_FLAGS_WORK)
  if(NOT KTFORGE_ARCH_FLAGS_WORK)
    message(FATAL_ERROR
      "The compiler ${CMAKE_CXX_COMPILER} (${CMAKE_CXX_COMPILER_VERSION}) rejects "
      "KTFORGE_ARCH_FLAGS='${KTFORGE_ARCH_FLAGS}'. Run `kt doctor --check toolchain.backend_flags` "
      "to see which flags this compiler accepts, or install a newer compiler.")
  endif()
  target_compile_options(${target} PRIVATE ${_flags})
endfunction()
