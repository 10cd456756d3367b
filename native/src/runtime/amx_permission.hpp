// Linux hands out AMX tile state per process, on request (arch_prctl ARCH_REQ_XCOMP_PERM for
// XTILEDATA, since 5.16). Asked once per process; the module and the AMX kernels both use
// this (probes/amx_permission.c asks the same in its own process, to report it).
#pragma once

namespace kt {

// 0 when granted, else the errno (EOPNOTSUPP: no AMX; EINVAL: a kernel without it).
int request_amx_permission();

}  // namespace kt
