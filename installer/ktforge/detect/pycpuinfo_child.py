"""Run by ``ktforge.detect.pycpuinfo.collect`` in a child Python: CPUID through py-cpuinfo's own
path (it executes machine code, so a fault here cannot take the doctor down). Prints one JSON
object: ``{"status": "ok", "vendor", "brand", "family", "model", "stepping", "flags"}`` or
``{"status": "failed", "detail"}``.

py-cpuinfo's get_cpu_info() prefers /proc/cpuinfo on Linux (a source the report already has)
and spends a second measuring the clock; its CPUID class is used directly instead.
"""

from __future__ import annotations

import json

from cpuinfo import cpuinfo


def main() -> None:
    arch, _ = cpuinfo._parse_arch(cpuinfo.DataSource.arch_string_raw)
    if arch not in ("X86_32", "X86_64"):
        print(json.dumps({"status": "failed", "detail": f"not an x86 CPU ({arch})"}))
        return
    cpuid = cpuinfo.CPUID(cpuinfo.Trace(False, False))
    if cpuid.is_selinux_enforcing:
        print(json.dumps({"status": "failed", "detail": "SELinux is enforcing: py-cpuinfo cannot execute CPUID"}))
        return
    top = cpuid.get_max_extension_support()
    info = cpuid.get_info()
    print(
        json.dumps(
            {
                "status": "ok",
                "vendor": cpuid.get_vendor_id(),
                "brand": cpuid.get_processor_brand(top),
                "family": info["family"],
                "model": info["model"],
                "stepping": info["stepping"],
                "flags": cpuid.get_flags(top),
            }
        )
    )


if __name__ == "__main__":
    main()
