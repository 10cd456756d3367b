"""The import guard: the installed build checked against this CPU (and the CPU-feature mask)
before any kernel runs, so an incompatible binary is a readable RuntimeError, never SIGILL."""

from __future__ import annotations

from ktforge.detect import mask

BACKEND_VARIABLE = "KTFORGE_BACKEND"


def import_guard() -> str | None:
    """Checks the installed build against this CPU before any kernel runs.

    Raises RuntimeError naming the missing features and the fix when the build's own backend
    (or the one KTFORGE_BACKEND selects) needs instructions this CPU or OS lacks; returns the
    backend KTFORGE_BACKEND selects, if any. Requests AMX permission once when the build
    targets AMX. The extension module itself is compiled without ISA flags, so asking it
    about the CPU cannot fault.
    """
    import errno
    import os

    import ktforge._native as native
    from ktforge.builder.build_record import checked_record

    # a missing, empty, invalid or mismatched record refuses the import: never a skipped guard
    record = checked_record(dict(native.build_info()))
    selected = os.environ.get(BACKEND_VARIABLE) or None
    backends = {b["name"]: b for b in record["backends"]}
    if selected is not None and selected not in backends:
        raise RuntimeError(
            f"{BACKEND_VARIABLE}={selected} is not compiled into this build (compiled: {', '.join(backends)})"
        )
    name = selected or record.get("primary_backend")
    if name is None:  # a plain build: "auto" picks the best compiled backend this CPU runs
        return selected
    missing = [f for f in backends[name]["required_cpu_features"] if not native.cpu_has(f)]
    masked = {f for f in missing if native.cpu_feature_disabled(f)}  # the CPU has them, the mask hides them
    if missing and selected is None and set(missing) == masked:
        return selected  # "auto" runs the best level left
    if missing and set(missing) == masked:
        raise RuntimeError(
            f"{BACKEND_VARIABLE}={selected} needs {', '.join(missing)}, which {mask.VARIABLE} disables; "
            f"unset one of the two"
        )
    if missing:
        lower = [n for n, b in backends.items() if all(native.cpu_has(f) for f in b["required_cpu_features"])]
        raise RuntimeError(
            f"ktforge was built ({record.get('recipe')} recipe, {record.get('arch_flags')}) for a CPU with "
            f"{', '.join(missing)}, which this CPU (or its OS) lacks; running it would crash with SIGILL. "
            f"Fix: rebuild here with `./install.sh build` (or `kt build`), or run a lower compiled backend with "
            f"{BACKEND_VARIABLE}={lower[0] if lower else 'reference'}."
        )
    if any(f.startswith("amx") for f in backends[name]["required_cpu_features"]):
        code = native.request_amx_permission()
        if code:
            raise RuntimeError(
                f"Linux refused AMX tile permission ({errno.errorcode.get(code, code)}); "
                f"see `kt doctor --check amx.permission`, or run {BACKEND_VARIABLE}=avx2"
            )
    return selected
