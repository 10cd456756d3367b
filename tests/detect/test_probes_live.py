"""The real probes on this machine, checked against the kernel's own view (/proc/cpuinfo)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from ktforge.detect import probe_runner
from ktforge.detect.amx import interpret
from ktforge.detect.cpuid import decode, leaves_from_rows
from ktforge.detect.features import REPORTED


@pytest.fixture(scope="module")
def cpu_facts():  # type: ignore[no-untyped-def]
    outcome = probe_runner.run_probe("cpu")
    assert outcome.ok, outcome.detail
    assert outcome.data is not None
    return decode(leaves_from_rows(outcome.data["leaves"]), outcome.data["xcr0"])


def test_cpu_probe_agrees_with_the_kernel_on_every_reported_feature(cpu_facts, host_flags) -> None:  # type: ignore[no-untyped-def]
    for feature in REPORTED:
        assert (feature in cpu_facts.usable_features()) == (feature in host_flags), feature


def test_xcr0_enables_avx512_state_exactly_where_the_kernel_lists_avx512(cpu_facts, host_flags) -> None:  # type: ignore[no-untyped-def]
    # Development machines differ (Sapphire Rapids, Zen 4 with AVX-512; Zen 3 without): the
    # kernel's flag list is the witness for what the OS enabled.
    assert cpu_facts.os_state.xcr0 is not None
    assert cpu_facts.os_state.avx is True and cpu_facts.os_state.xcr0 & 0x6 == 0x6
    assert cpu_facts.os_state.avx512 is ("avx512f" in host_flags)
    assert (cpu_facts.os_state.xcr0 & 0xE0 == 0xE0) is ("avx512f" in host_flags)
    assert {"avx2", "fma", "f16c"} <= cpu_facts.usable_features()  # every x86-64 ktforge runs on


def test_amx_permission_probe_matches_the_cpu(cpu_facts, host_flags) -> None:  # type: ignore[no-untyped-def]
    has_amx = "amx_tile" in cpu_facts.cpu_features
    assert has_amx == ("amx_tile" in host_flags)
    args = ["--prove"] if has_amx and cpu_facts.os_state.amx else []
    outcome = probe_runner.run_probe("amx_permission", args)
    assert outcome.ok, outcome.detail
    result = interpret(outcome.to_json(), has_amx, cpu_facts.os_state.amx)
    if has_amx:
        # AMX machine: the kernel grants XTILEDATA and the tiles really execute
        assert result["verdict"] == "available", result["explanation"]
        assert result["permitted_after"] & (1 << 18)
    else:
        # no AMX (e.g. AMD Zen 4): the kernel refuses with EOPNOTSUPP, reported as "no AMX"
        assert result["request_errno"] == errno.EOPNOTSUPP
        assert result["verdict"] == "no-amx-cpu"


def test_probe_binaries_are_cached_by_source_and_compiler() -> None:
    first, failure = probe_runner.compile_probe("cpu")
    assert failure is None and first is not None
    stamp = first.stat().st_mtime_ns
    second, _ = probe_runner.compile_probe("cpu")
    assert second == first and first.stat().st_mtime_ns == stamp


def _fake_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str) -> None:
    (tmp_path / "probes").mkdir(exist_ok=True)
    (tmp_path / "probes" / "fake.c").write_text(source)
    monkeypatch.setattr(probe_runner, "data_path", lambda *parts: tmp_path.joinpath(*parts))


def test_probe_that_does_not_compile_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_probe(tmp_path, monkeypatch, "int main(void) { return syntax error; }\n")
    outcome = probe_runner.run_probe("fake")
    assert outcome.status == "compile-failed" and "error" in outcome.detail


def test_probe_that_crashes_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_probe(
        tmp_path,
        monkeypatch,
        "#include <stdio.h>\n#include <signal.h>\n"
        'int main(void) { printf("{\\"a\\": 1"); fflush(stdout); raise(SIGSEGV); return 0; }\n',
    )
    outcome = probe_runner.run_probe("fake")
    assert outcome.status == "crashed" and "SIGSEGV" in outcome.detail
    assert outcome.data == {"a": 1}  # what it printed before dying is kept


def test_probe_that_hangs_is_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_probe(tmp_path, monkeypatch, "#include <unistd.h>\nint main(void) { sleep(30); return 0; }\n")
    outcome = probe_runner.run_probe("fake", timeout_s=0.5)
    assert outcome.status == "timeout"


def test_probe_with_garbage_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_probe(tmp_path, monkeypatch, '#include <stdio.h>\nint main(void) { puts("hello"); return 0; }\n')
    assert probe_runner.run_probe("fake").status == "bad-output"


def test_no_compiler_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.setattr(probe_runner, "which", lambda name: None)
    outcome = probe_runner.run_probe("cpu")
    assert outcome.status == "no-compiler" and "install.sh deps" in outcome.detail


def test_a_probe_that_hangs_on_one_library_still_answers_for_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the BLIS probe runs once per library: a library that hangs it must not silence the others
    _fake_probe(
        tmp_path,
        monkeypatch,
        "#include <stdio.h>\n#include <string.h>\n#include <unistd.h>\n"
        'int main(int argc, char** argv) { if (argc > 1 && !strcmp(argv[1], "hang")) for (;;) pause();'
        ' puts("{}"); return 0; }\n',
    )
    assert probe_runner.run_probe("fake", ["hang"], timeout_s=0.5).status == "timeout"
    assert probe_runner.run_probe("fake", ["fine"], timeout_s=5).status == "ok"
