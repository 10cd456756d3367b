# ccache, where it is installed: the same source compiled with the same flags is compiled once,
# across build directories and checkouts (paths under the source tree are hashed relative to it),
# as the suite's builds and a second clone's are. -DKTFORGE_CCACHE=OFF compiles directly.
option(KTFORGE_CCACHE "Compile through ccache when it is installed" ON)
if(KTFORGE_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  find_program(KTFORGE_CCACHE_PROGRAM ccache)
  if(KTFORGE_CCACHE_PROGRAM)
    set(_ktforge_launcher ${CMAKE_COMMAND} -E env CCACHE_BASEDIR=${PROJECT_SOURCE_DIR} ${KTFORGE_CCACHE_PROGRAM})
    set(CMAKE_C_COMPILER_LAUNCHER ${_ktforge_launcher})
    set(CMAKE_CXX_COMPILER_LAUNCHER ${_ktforge_launcher})
  endif()
endif()
