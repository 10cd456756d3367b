"""For the reference runs of vLLM without ktforge (KTFORGE_VLLM=0) only: vLLM 0.32's CPU attention
runs AMX tile instructions without asking Linux for tile permission, and dies of SIGILL on AMX
hosts; ktforge's plugin asks (ktforge.engines.vllm), so with the plugin off this asks instead."""

import ctypes

ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA, SYS_ARCH_PRCTL = 0x1023, 18, 158
ctypes.CDLL(None, use_errno=True).syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
