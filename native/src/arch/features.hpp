// The ISA features the including translation unit is compiled for, from the compiler's
// predefined macros (Linux /proc/cpuinfo spellings). Each backend's table reports them,
// so what a binary may execute is known without trusting the build host. The macro table
// is ktforge.detect.features.COMPILER_MACROS, generated into cpu_features.gen.hpp at configure time.
#pragma once

#include "cpu_features.gen.hpp"
