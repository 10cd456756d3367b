# ISA flags of the SIMD backends.
#
# KTFORGE_ARCH_FLAGS (default -march=native) is applied to every SIMD backend on top of
# the backend's own minimum flags, so a host build uses everything the host has (VNNI,
# BF16, ...). A backend whose minimum flags the compiler rejects stops the configure
# step with the fix, rather than being silently dropped.
set(KTFORGE_ARCH_FLAGS "-march=native" CACHE STRING "ISA flags for the SIMD backends")

set(KTFORGE_FLAGS_avx2 -mavx2 -mfma -mf16c)
set(KTFORGE_FLAGS_avx512 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma -mf16c)
set(KTFORGE_FLAGS_amx ${KTFORGE_FLAGS_avx512} -mamx-tile -mamx-int8 -mamx-bf16)
# the AMX kernels on the software tile unit: AVX2 flags only, so the tile code is tested on
# any AVX2 CPU (its non-tile work goes to the avx512 or avx2 backend at run time)
set(KTFORGE_FLAGS_amx_model ${KTFORGE_FLAGS_avx2} -DKTFORGE_AMX_MODEL)
# Backends whose flags are exactly their level's: the host's -march must not let the
# compiler emit anything above it (AVX-512 in an AVX2 backend).
set(KTFORGE_FIXED_LEVEL_BACKENDS avx2 amx_model)
# What each backend calls into: amx and amx_model use the SIMD tables for non-tile work.
set(KTFORGE_NEEDS_amx avx512)
set(KTFORGE_NEEDS_amx_model avx2)
set(KTFORGE_DIR_avx2 arch/x86/avx2)
set(KTFORGE_DIR_avx512 arch/x86/avx512)
set(KTFORGE_DIR_amx arch/x86/amx)
set(KTFORGE_DIR_amx_model arch/x86/amx)

include(CheckCXXCompilerFlag)

function(ktforge_add_backend name)
  if(NOT DEFINED KTFORGE_FLAGS_${name})
    message(FATAL_ERROR "Unknown backend '${name}' in KTFORGE_BACKENDS (known: amx, avx512, avx2, amx_model).")
  endif()
  separate_arguments(_arch UNIX_COMMAND "${KTFORGE_ARCH_FLAGS}")
  foreach(needed IN LISTS KTFORGE_NEEDS_${name})
    if(NOT needed IN_LIST KTFORGE_BACKENDS)
      message(FATAL_ERROR "Backend '${name}' needs backend '${needed}': add it to KTFORGE_BACKENDS "
                          "(now '${KTFORGE_BACKENDS}').")
    endif()
  endforeach()
  if(name IN_LIST KTFORGE_FIXED_LEVEL_BACKENDS)
    set(_flags ${KTFORGE_FLAGS_${name}} -mtune=native)
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
      "`kt doctor --check toolchain.backend_flags` shows what this compiler accepts.")
  endif()
  add_library(ktforge_${name} OBJECT ${CMAKE_CURRENT_SOURCE_DIR}/src/${KTFORGE_DIR_${name}}/kernels.cpp)
  target_include_directories(ktforge_${name} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
  target_compile_options(ktforge_${name} PRIVATE ${_flags} -O3 -Wall -Wextra)
  target_sources(ktforge_core PRIVATE $<TARGET_OBJECTS:ktforge_${name}>)
endfunction()
