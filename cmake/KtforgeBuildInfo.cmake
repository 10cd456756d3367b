# ISA flags of the SIMD backends.
#
# KTFORGE_ARCH_FLAGS (default -march=native) is applied to every SIMD backend on top of
# the backend's own minimum flags, so a host build uses everything the host has (VNNI,
# BF16, ...). A backend whose minimum flags the compiler rejects stops the configure
# step with the fix, rather than being silently dropped.
set(KTFORGE_ARCH_FLAGS "-march=native" CACHE STRING "ISA flags for the SIMD backends")
# A portable build (kt build --portable) runs on any x86-64: each backend is compiled with
# exactly its level's flags (nothing of the build machine), the core with none at all, and
# the best level this CPU, its OS state and its AMX permission allow is chosen at run time.
option(KTFORGE_PORTABLE "One binary for every x86-64: each backend at exactly its level" OFF)
if(KTFORGE_PORTABLE)
  set(KTFORGE_ARCH_FLAGS "" CACHE STRING "ISA flags for the SIMD backends" FORCE)
endif()

# Each backend's flags, folder and dependencies come from the backend table
# (installer/ktforge/data/backends.json), generated into ktforge_backends.cmake by native/.

include(CheckCXXCompilerFlag)

function(ktforge_add_backend name)
  if(NOT name IN_LIST KTFORGE_KNOWN_BACKENDS)
    message(FATAL_ERROR "Unknown backend '${name}' in KTFORGE_BACKENDS (known: ${KTFORGE_KNOWN_BACKENDS}; "
                        "the table is installer/ktforge/data/backends.json).")
  endif()
  separate_arguments(_arch UNIX_COMMAND "${KTFORGE_ARCH_FLAGS}")
  foreach(needed IN LISTS KTFORGE_NEEDS_${name})
    if(NOT needed IN_LIST KTFORGE_BACKENDS)
      message(FATAL_ERROR "Backend '${name}' needs backend '${needed}': add it to KTFORGE_BACKENDS "
                          "(now '${KTFORGE_BACKENDS}').")
    endif()
  endforeach()
  # A backend at exactly its level (every backend of a portable build; in a host build those
  # the host's -march must not lift, e.g. avx2 on an AVX-512 host) gets its level's flags and
  # nothing else, so a host build and the portable wheel run the same code for it. No
  # -mtune=native either: on Zen 3 it made the int8/int4 inner loops 3-9% slower, bf16 even.
  if(KTFORGE_PORTABLE OR NOT KTFORGE_HOST_MARCH_${name})
    set(_flags ${KTFORGE_FLAGS_${name}})
  else()
    set(_flags ${_arch} ${KTFORGE_FLAGS_${name}})
  endif()
  string(REPLACE ";" " " _joined "${_flags}")
  set(CMAKE_REQUIRED_QUIET ON)
  check_cxx_compiler_flag("${_joined}" KTFORGE_FLAGS_OK_${name})
  if(NOT KTFORGE_FLAGS_OK_${name})
    message(FATAL_ERROR
      "The compiler ${CMAKE_CXX_COMPILER} (${CMAKE_CXX_COMPILER_VERSION}) rejects the ${name} flags "
      "'${_joined}'. Install a newer compiler, or leave ${name} out of KTFORGE_BACKENDS. "
      "`kt doctor --check toolchain.recipe_flags` shows what this compiler accepts.")
  endif()
  add_library(ktforge_${name} OBJECT ${CMAKE_CURRENT_SOURCE_DIR}/src/${KTFORGE_DIR_${name}}/kernels.cpp)
  target_include_directories(ktforge_${name} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src ${_ktforge_generated})
  target_compile_options(ktforge_${name} PRIVATE ${_flags} -O3 -Wall -Wextra)
  target_sources(ktforge_core PRIVATE $<TARGET_OBJECTS:ktforge_${name}>)
endfunction()
