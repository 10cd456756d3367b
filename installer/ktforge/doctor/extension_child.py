"""Run by ``ktforge.detect.extension.inspect`` in a child Python: import the native extension
and say how it went, one JSON line per stage (a SIGILL at import still leaves "located").

``python -I -m ktforge.doctor.extension_child MODULE``; the last line printed is the verdict.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from typing import Any


def _say(document: dict[str, Any]) -> None:
    print(json.dumps(document), flush=True)


def main(name: str) -> None:
    try:
        spec = importlib.util.find_spec(name)
    except Exception as exc:  # a broken package on the way: reported, not raised
        return _say({"status": "broken", "error": f"{type(exc).__name__}: {exc}"})
    if spec is None:
        return _say({"status": "missing"})
    origin = spec.origin
    _say({"status": "located", "path": origin})
    try:
        info = importlib.import_module(name).build_info()
    except Exception as exc:
        return _say({"status": "broken", "path": origin, "error": f"{type(exc).__name__}: {exc}"})
    import ktforge
    from ktforge.builder.build_record import installed_record

    try:
        import ktforge.kernels.moe  # runs the import guard, exactly as using the kernels does
    except Exception as exc:
        return _say({"status": "refused", "path": origin, "error": str(exc), "build_info": dict(info)})
    _say(
        {
            "status": "importable",
            "path": origin,
            "build_info": dict(info),
            "package_version": ktforge.__version__,
            "record": installed_record(),
            "selection": ktforge.kernels.moe.build_info()["selection"],
        }
    )


if __name__ == "__main__":
    main(sys.argv[1])
