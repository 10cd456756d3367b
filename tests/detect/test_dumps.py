"""Parsers of the texts `kt doctor --from` accepts, including mangled lscpu pastes."""

from __future__ import annotations

import json
import textwrap

import pytest

from ktforge.detect import dumps

from ..conftest import CPUINFO_FIXTURES, HOST_FIXTURES, terminal_wrap

LSCPU = (HOST_FIXTURES / "kvm-sapphirerapids-masked.lscpu").read_text()
LSCPU_JSON = json.loads((HOST_FIXTURES / "kvm-sapphirerapids-masked.lscpu.json").read_text())


def _flags_line(text: str) -> set[str]:
    line = next(line for line in text.splitlines() if line.startswith("Flags:"))
    return set(line.split(":", 1)[1].split())


def test_lscpu_text_fields() -> None:
    cpu = dumps.parse_lscpu_text(LSCPU)
    assert cpu.arch == "x86_64"
    assert cpu.vendor == "GenuineIntel"
    assert cpu.family == 6 and cpu.model == 167
    assert cpu.hypervisor == "KVM"
    assert cpu.numa_nodes == {0: [0, 1]}
    assert cpu.flags == _flags_line(LSCPU)
    assert {"avx512f", "amx_tile", "avx512_bf16"} <= cpu.flags


def test_lscpu_json_matches_text() -> None:
    from_json = dumps.parse_lscpu_json(LSCPU_JSON)
    from_text = dumps.parse_lscpu_text(LSCPU)
    assert from_json == from_text


@pytest.mark.parametrize("width", [40, 63, 80, 97])
def test_lscpu_wrapped_mid_word_is_mended(width: int) -> None:
    wrapped = terminal_wrap(LSCPU, width)
    # the wrap really cut words: at least one flag no longer appears whole
    assert not _flags_line(LSCPU) <= set(wrapped.split())
    cpu = dumps.parse_lscpu_text(wrapped)
    assert cpu.flags == _flags_line(LSCPU)
    assert cpu.vendor == "GenuineIntel" and cpu.model == 167


def test_flag_cut_mid_word_in_reflowed_paste_is_mended_by_vocabulary() -> None:
    # line lengths disturbed (trailing text trimmed): only the flag vocabulary can tell
    text = "Architecture: x86_64\nFlags: fma avx512\n  bw avx2 amx_ti\n  le\nHypervisor vendor: KVM\n"
    text = text.replace("amx_ti\n  le", "amx_t\n  ile")
    cpu = dumps.parse_lscpu_text(text)
    assert {"fma", "avx512bw", "avx2", "amx_tile"} <= cpu.flags
    assert "bw" not in cpu.flags and cpu.hypervisor == "KVM"


def test_lscpu_wrapped_at_word_boundaries_keeps_every_flag() -> None:
    head, _, flags = next(line for line in LSCPU.splitlines() if line.startswith("Flags:")).partition(":")
    wrapped_flags = textwrap.fill(flags.strip(), width=70, subsequent_indent=" " * 41)
    text = LSCPU.replace(f"{head}:{flags}", f"{head}:{' ' * 34}{wrapped_flags}")
    assert dumps.parse_lscpu_text(text).flags == _flags_line(LSCPU)


@pytest.mark.parametrize("style", ["indent", "fence", "quote"])
def test_lscpu_pasted_from_markdown(style: str) -> None:
    if style == "indent":
        text = textwrap.indent(LSCPU, "    ")
    elif style == "fence":
        text = "```\n" + LSCPU + "```\n"
    else:
        text = textwrap.indent(LSCPU, "> ")
    assert dumps.sniff(text) == "lscpu"
    cpu = dumps.parse_lscpu_text(text)
    assert cpu.flags == _flags_line(LSCPU)
    assert cpu.hypervisor == "KVM"


def test_cpuinfo_x86_and_arm() -> None:
    zen4 = dumps.parse_cpuinfo((CPUINFO_FIXTURES / "linux-rocky8.5-zen4").read_text())
    assert (zen4.arch, zen4.vendor, zen4.family, zen4.model) == ("x86_64", "AuthenticAMD", 25, 17)
    assert {"avx512f", "avx512_vnni", "avx512_bf16"} <= zen4.flags
    arm = dumps.parse_cpuinfo((CPUINFO_FIXTURES / "linux-amazon-neoverse_v1").read_text())
    assert arm.arch == "aarch64" and arm.vendor is None


def test_sysctl_intel_and_apple() -> None:
    haswell = dumps.parse_sysctl((CPUINFO_FIXTURES / "darwin-mojave-haswell").read_text())
    assert haswell.arch == "x86_64" and {"avx2", "fma", "f16c"} <= haswell.flags
    m3 = dumps.parse_sysctl((CPUINFO_FIXTURES / "darwin-sequoia-m3").read_text())
    assert m3.arch == "aarch64" and m3.brand == "Apple M3 Max"


@pytest.mark.parametrize(
    ("name", "kind"),
    [("linux-rocky8.5-zen4", "cpuinfo"), ("darwin-mojave-haswell", "sysctl"), ("windows-cpuid-icelake", "cpuid-dump")],
)
def test_sniff_fixture_formats(name: str, kind: str) -> None:
    assert dumps.sniff((CPUINFO_FIXTURES / name).read_text()) == kind


def test_sniff_lscpu_formats() -> None:
    assert dumps.sniff(LSCPU) == "lscpu"
    assert dumps.sniff(json.dumps(LSCPU_JSON)) == "lscpu-json"


@pytest.mark.parametrize("text", ["", "hello world\n", '{"some": "json"}', "{not json", "1, 2, 3\n"])
def test_unrecognised_text_is_a_clear_error(text: str) -> None:
    with pytest.raises(dumps.DumpFormatError):
        dumps.sniff(text)


def test_cpu_list() -> None:
    assert dumps.parse_cpu_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert dumps.parse_cpu_list("") == []
