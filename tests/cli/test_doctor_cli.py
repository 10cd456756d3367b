"""`kt doctor` as a user runs it: exit codes, JSON schema, plain output, snapshots and replay."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from typer.testing import CliRunner

from ktforge.cli import commands as cli
from ktforge.doctor import list_checks
from ktforge.resources import data_path

from ..conftest import CPUINFO_FIXTURES, HOST_FIXTURES

runner = CliRunner()
SCHEMA = json.loads(data_path("doctor.schema.json").read_text())
ANSI = re.compile(r"\x1b\[")


def _doctor(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = runner.invoke(cli.app, ["doctor", *args], env=env)
    return result.exit_code, result.stdout


@pytest.fixture(scope="module")
def live_json() -> dict[str, Any]:
    code, out = _doctor("--json")
    document: dict[str, Any] = json.loads(out)
    document["_exit"] = code
    return document


def test_live_json_is_valid_against_the_schema(live_json: dict[str, Any]) -> None:
    code = live_json.pop("_exit")
    jsonschema.validate(live_json, SCHEMA)
    assert code == (1 if live_json["summary"]["error"] else 0)
    assert [c["id"] for c in live_json["checks"]] == [cid for cid, _, _ in list_checks()]


def test_live_json_sees_this_machine(live_json: dict[str, Any], host_flags: set[str]) -> None:
    # /proc/cpuinfo, read directly, is the independent witness for what the probes saw
    report = live_json["report"]
    assert report["source"]["kind"] == "live"
    has_avx512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= host_flags
    assert report["cpu"]["os_state"]["avx512"] is ("avx512f" in host_flags)
    checks = {c["id"]: c for c in live_json["checks"]}
    assert checks["cpu.avx512"]["status"] == ("ok" if has_avx512 else "info")
    assert checks["cpu.avx2_fma"]["status"] == ("ok" if {"avx2", "fma", "f16c"} <= host_flags else "error")
    assert checks["probes.ran"]["status"] == "ok"
    if "amx_tile" in host_flags:
        expected = "amx"
    elif has_avx512 and report["cpu"]["vendor"] == "AuthenticAMD" and report["blis"]["selected"]:
        expected = "amd-blis"
    else:
        expected = "avx512" if has_avx512 else "avx2"
    assert live_json["recommended_recipe"] == expected
    if "amx_tile" not in host_flags:
        assert checks["amx.permission"]["status"] == "info"
        assert "EOPNOTSUPP" in checks["amx.permission"]["finding"]


def test_json_is_stable_between_runs(live_json: dict[str, Any]) -> None:
    _, out = _doctor("--json")
    again = json.loads(out)
    live_json.pop("_exit", None)
    # available memory moves between two runs; every other finding must be identical
    volatile = {"system.memory"}
    assert [(c["id"], c["status"]) for c in again["checks"]] == [(c["id"], c["status"]) for c in live_json["checks"]]
    assert [c for c in again["checks"] if c["id"] not in volatile] == [
        c for c in live_json["checks"] if c["id"] not in volatile
    ]
    assert again["report"]["cpu"] == live_json["report"]["cpu"]


def test_plain_output_without_a_tty_has_no_colour_and_a_summary() -> None:
    _code, out = _doctor()
    assert not ANSI.search(out)
    assert out.startswith("ktforge doctor: this machine:")
    assert re.search(
        r"^Summary: \d+ ok, \d+ info, \d+ warnings, \d+ errors, \d+ unknown; recommended recipe: ", out, re.MULTILINE
    )
    for cid, _, _ in list_checks():
        assert f" {cid} " in out


def test_no_color_is_honoured_even_when_colour_would_be_used(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from ktforge.cli.render import use_color

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert use_color(Tty()) is True
    monkeypatch.setenv("NO_COLOR", "1")
    assert use_color(Tty()) is False


def test_list_checks_and_check_subset() -> None:
    code, out = _doctor("--list-checks")
    assert code == 0 and "amx.permission" in out and "blis.addon" in out
    code, out = _doctor("--json", "--check", "cpu.avx512", "--check", "os.xcr0")
    assert [c["id"] for c in json.loads(out)["checks"]] == ["cpu.avx512", "os.xcr0"]


def test_unknown_check_id_exits_2() -> None:
    result = runner.invoke(cli.app, ["doctor", "--check", "no.such"])
    assert result.exit_code == 2 and "unknown check id" in result.stderr


def test_non_x86_dump_exits_1_with_the_reason() -> None:
    code, out = _doctor("--from", str(CPUINFO_FIXTURES / "linux-amazon-neoverse_v1"))
    assert code == 1
    assert "this is aarch64" in out and "recommended recipe: none" in out


def test_replayed_dump_is_schema_valid_and_marks_unknowns() -> None:
    code, out = _doctor("--json", "--from", str(CPUINFO_FIXTURES / "linux-rocky8.5-zen4"))
    document = json.loads(out)
    jsonschema.validate(document, SCHEMA)
    assert code == 0 and document["recommended_recipe"] == "avx512"
    statuses = {c["id"]: c["status"] for c in document["checks"]}
    assert statuses["blis.found"] == "unknown" and statuses["os.xcr0"] == "unknown"
    assert statuses["amx.cpuid"] == "info"


def test_lscpu_json_and_text_replay_agree() -> None:
    _, from_text = _doctor("--json", "--from", str(HOST_FIXTURES / "kvm-sapphirerapids-masked.lscpu"))
    _, from_json = _doctor("--json", "--from", str(HOST_FIXTURES / "kvm-sapphirerapids-masked.lscpu.json"))
    a, b = json.loads(from_text), json.loads(from_json)
    assert a["recommended_recipe"] == b["recommended_recipe"] == "amx"
    assert a["report"]["cpu"]["usable_features"] == b["report"]["cpu"]["usable_features"]


def test_snapshot_replays_to_the_same_report(tmp_path: Path) -> None:
    snap = tmp_path / "snap.json"
    code_live, out_live = _doctor("--json", "--snapshot", str(snap))
    code_replay, out_replay = _doctor("--json", "--from", str(snap))
    live, replay = json.loads(out_live), json.loads(out_replay)
    assert code_live == code_replay
    assert replay["checks"] == live["checks"]  # same evidence, same findings (memory included)
    assert replay["report"]["cpu"] == live["report"]["cpu"]
    assert replay["report"]["source"]["origin"] == str(snap)
    saved = json.loads(snap.read_text())
    assert saved["ktforge_snapshot"] == 1
    assert saved["evidence"]["cpu_probe"]["status"] == "ok"
    assert "flags" in saved["evidence"]["cpuinfo_text"]


def test_strict_turns_warnings_into_failure(tmp_path: Path) -> None:
    document = json.loads((HOST_FIXTURES / "kvm-sapphirerapids-masked.snapshot.json").read_text())
    document["evidence"]["extension"] = {"status": "missing"}  # a warning: not built yet
    snap = tmp_path / "warn.json"
    snap.write_text(json.dumps(document))
    assert _doctor("--from", str(snap))[0] == 0
    code, out = _doctor("--strict", "--from", str(snap))
    assert code == 1 and "./install.sh build" in out


def test_unreadable_input_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("this is not a cpu dump\n")
    result = runner.invoke(cli.app, ["doctor", "--from", str(bad)])
    assert result.exit_code == 2 and "cannot read" in result.stderr
    result = runner.invoke(cli.app, ["doctor", "--from", str(tmp_path / "missing")])
    assert result.exit_code == 2


def test_a_deeply_nested_snapshot_is_one_line(tmp_path: Path) -> None:
    deep = tmp_path / "snapshot.json"
    deep.write_text('{"ktforge_snapshot": ' + "[" * 100_000 + "]" * 100_000 + "}")
    result = runner.invoke(cli.app, ["doctor", "--from", str(deep)])
    assert result.exit_code == 2 and "nested too deeply" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_doctor_that_breaks_exits_2_with_a_message(monkeypatch: pytest.MonkeyPatch) -> None:
    import ktforge.builder.assessment

    def explode(_: object) -> None:
        raise RuntimeError("simulated internal failure")

    monkeypatch.setattr(ktforge.builder.assessment, "assess", explode)
    result = runner.invoke(cli.app, ["doctor"])
    assert result.exit_code == 2
    assert "kt doctor failed: RuntimeError: simulated internal failure" in result.stderr


def test_live_json_lists_the_kernel_of_every_format(live_json: dict[str, Any]) -> None:
    import ktforge
    from ktforge import formats

    finding = next(c for c in live_json["checks"] if c["id"] == "extension.kernels")
    selection = ktforge.build_info()["selection"]
    runs = selection["override"] or selection["auto"]
    assert finding["status"] == "info" and finding["finding"].startswith(f"{runs}: ")
    kernels = next(b["kernels"] for b in ktforge.build_info()["backends"] if b["name"] == runs)
    for name in formats.names():  # each format with the kernel the selected backend runs it on
        assert f"{name}: {kernels[name]}" in finding["finding"]
