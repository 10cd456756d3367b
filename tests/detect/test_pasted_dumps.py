"""`kt doctor --from` on what people really paste: every lscpu layout util-linux prints, in
every language it ships, for every x86-64 Linux fixture machine, with the decorations that
copying from a terminal, a chat or a Markdown page adds.

The dumps in tests/fixtures/pasted/<machine>/ were made by the real tools
(tests/fixtures/pasted/generate.py: `lscpu --sysroot` over each machine's /proc/cpuinfo,
piped and through `script` in terminals of 60-200 columns, with util-linux's catalogs).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ktforge.builder.assessment import assess
from ktforge.cli import commands as cli
from ktforge.detect import dumps, evidence

from ..conftest import CPUINFO_FIXTURES, FIXTURES, terminal_wrap

PASTED = FIXTURES / "pasted"
# machine -> (recipe, microarchitecture). Names come from the model number where the table
# knows it: the "alderlake" fixture is a Core Ultra 9 285 (family 6 model 198, Arrow Lake),
# the "x86_64_v3" one a Xeon E5-2680 v3 (model 63, Haswell) that does not show aes.
EXPECTED: dict[str, tuple[str, str]] = {
    "kvm-epyc-milan": ("avx2", "zen3"),
    "linux-centos7-cascadelake": ("avx512", "cascadelake"),
    "linux-rhel6-piledriver": ("none", "piledriver"),
    "linux-rhel7-broadwell": ("avx2", "broadwell"),
    "linux-rhel7-haswell": ("avx2", "haswell"),
    "linux-rhel7-ivybridge": ("none", "ivybridge"),
    "linux-rhel7-skylake_avx512": ("avx512", "skylake_avx512"),
    "linux-rhel7-x86_64_v3": ("avx2", "haswell"),
    "linux-rhel7-zen": ("avx2", "zen"),
    "linux-rocky8.5-zen4": ("avx512", "zen4"),
    "linux-rocky9-zen5": ("avx512", "zen5"),
    "linux-scientific7-k10": ("none", "k10"),
    "linux-scientific7-piledriver": ("none", "piledriver"),
    "linux-scientificfermi6-bulldozer": ("none", "bulldozer"),
    "linux-scientificfermi6-piledriver": ("none", "piledriver"),
    "linux-ubuntu18.04-broadwell": ("avx2", "broadwell"),
    "linux-ubuntu20.04-zen3": ("avx2", "zen3"),
    "linux-ubuntu24.04-alderlake": ("avx2", "arrowlake_s"),
    "linux-ubuntu26.04-arrowlake_s": ("avx2", "arrowlake_s"),
    "linux-unknown-sapphirerapids": ("amx", "sapphirerapids"),
}
MANY_CPUS = {"linux-unknown-sapphirerapids": 224, "linux-rocky8.5-zen4": 192}
DUMPS = sorted(p for p in PASTED.glob("*/*.txt"))


def source_cpuinfo(machine: str) -> str:
    path = CPUINFO_FIXTURES / machine
    return (path if path.exists() else PASTED / f"{machine}.cpuinfo").read_text()


def source_flags(machine: str) -> frozenset[str]:
    line = next(line for line in source_cpuinfo(machine).splitlines() if line.startswith("flags"))
    return frozenset(line.split(":", 1)[1].split())


def check(machine: str, text: str, cpus: int | None = None, numa: bool = False) -> None:
    ev = evidence.from_text(text)
    report = assess(ev)
    recipe, uarch = EXPECTED[machine]
    cpu = report["cpu"]
    assert set(cpu["features"]) == source_flags(machine)
    assert cpu["arch"] == "x86_64"
    assert cpu["vendor"] in ("GenuineIntel", "AuthenticAMD")
    assert report["recipe"]["recommended"] == recipe
    assert cpu["microarchitecture"]["name"] == uarch
    if cpus is not None:
        assert cpu["logical_cpus"] == cpus
    if numa:
        assert report["numa"] is not None and sorted(report["numa"]["nodes"]) == ["0", "1"]


def test_every_machine_and_layout_was_generated() -> None:
    assert {p.name for p in PASTED.iterdir() if p.is_dir()} == set(EXPECTED)
    for machine in EXPECTED:
        names = {p.name for p in (PASTED / machine).glob("*.txt")}
        # 7 layouts: 3 in 10 languages, 4 in English; with many CPUs all again, and their cpuinfo
        assert len(names) == (69 if machine in MANY_CPUS else 34), machine
    assert len(DUMPS) == 750


@pytest.mark.parametrize("path", DUMPS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_generated_dump(path: Path) -> None:
    machine = path.parent.name
    cpus = MANY_CPUS[machine] if path.name.startswith("many-") else None
    text = path.read_bytes().decode()
    kind = dumps.sniff(text)
    layout = path.name.removeprefix("many-").split(".")[0]
    assert kind == {"json": "lscpu-json", "lscpu": "lscpu", "cpuinfo": "cpuinfo"}[layout.split("-")[0]]
    check(machine, text, cpus, numa=cpus is not None and kind != "cpuinfo")


def test_the_terminal_layout_is_really_nested_and_wrapped() -> None:
    text = (PASTED / "linux-rocky8.5-zen4" / "lscpu-tty80.en.txt").read_bytes().decode()
    assert "\r\n" in text  # script(1) gives what a terminal shows: CRLF
    assert re.search(r"^  Model name:", text, re.MULTILINE)  # nested under "Vendor ID:"
    lines = text.split("\r\n")
    assert max(len(line) for line in lines) == 80
    cut = source_flags("linux-rocky8.5-zen4") - set(" ".join(lines).split())
    assert len(cut) > 10  # flags cut in two by the wrap ...
    assert dumps.parse_lscpu_text(text).flags == source_flags("linux-rocky8.5-zen4")  # ... and mended


PROMPTS = ["$ lscpu", "user@gpu-box:~$ lscpu", "[root@node1 ~]# LANG=C lscpu", "\u276f sudo lscpu -J", "PS> lscpu"]
SAMPLES = [
    ("linux-rocky8.5-zen4", "lscpu-tty80.en"),
    ("linux-unknown-sapphirerapids", "lscpu-tty80.zh_CN"),
    ("linux-rhel7-haswell", "lscpu-flat.de"),
    ("linux-centos7-cascadelake", "lscpu-tty60.en"),
    ("kvm-epyc-milan", "lscpu-tty80.ja"),
    ("linux-rocky9-zen5", "json-nested.fr"),
]


def _decorate(text: str, style: str, prompt: str) -> str:
    plain = text.replace("\r\n", "\n")
    if style == "prompt":
        return f"{prompt}\n{text}user@gpu-box:~$ \n"
    if style == "markdown-indent":
        return textwrap.indent(f"{prompt}\n{plain}", "    ")
    if style == "fence":
        return f"```console\n{prompt}\n{plain}```\n"
    if style == "quote":
        return textwrap.indent(plain, "> ", lambda _: True)
    if style == "nested-quote":
        return textwrap.indent(plain, "> > ", lambda _: True)
    if style == "trailing-spaces":
        return "\n".join(line + "   " for line in plain.split("\n"))
    if style == "padded":  # some terminals' copy pads every line to the width
        width = max(len(line) for line in plain.split("\n"))
        return "\n".join(line.ljust(width) for line in plain.split("\n"))
    if style == "lf":
        return plain
    raise AssertionError(style)


STYLES = ["prompt", "markdown-indent", "fence", "quote", "nested-quote", "trailing-spaces", "padded", "lf"]


# JSON is pasted as it is, with a prompt or a fence around it at most
DECORATED = [
    (machine, stem, style)
    for machine, stem in SAMPLES
    for style in STYLES
    if not stem.startswith("json") or style in ("prompt", "fence", "lf")
]


@pytest.mark.parametrize(("machine", "stem", "style"), DECORATED, ids=[f"{m}/{s}-{d}" for m, s, d in DECORATED])
def test_pasted_with_decorations(machine: str, stem: str, style: str) -> None:
    text = (PASTED / machine / f"{stem}.txt").read_bytes().decode()
    check(machine, _decorate(text, style, PROMPTS[len(style) % len(PROMPTS)]))


@pytest.mark.parametrize("width", [50, 73, 80, 101, 160])
@pytest.mark.parametrize("machine", ["linux-unknown-sapphirerapids", "linux-rocky8.5-zen4", "kvm-epyc-milan"])
def test_flat_layout_wrapped_by_a_narrow_terminal(machine: str, width: int) -> None:
    # A flat (piped or pre-2.37) dump shown in a terminal and copied: every line cut at the
    # width, mid-word, continuation lines at column 0.
    check(machine, terminal_wrap((PASTED / machine / "lscpu-flat.en.txt").read_text(), width))


def test_cpuinfo_with_hundreds_of_processors_and_crlf() -> None:
    text = (PASTED / "linux-unknown-sapphirerapids" / "many-cpuinfo.txt").read_text()
    assert text.count("processor\t:") == 224
    check("linux-unknown-sapphirerapids", text.replace("\n", "\r\n"))
    assert assess(evidence.from_text(text))["cpu"]["logical_cpus"] == 224


def test_doctor_from_reads_a_localized_nested_paste(tmp_path: Path) -> None:
    dump = tmp_path / "paste.txt"
    dump.write_bytes((PASTED / "linux-unknown-sapphirerapids" / "lscpu-tty80.zh_TW.txt").read_bytes())
    result = CliRunner().invoke(cli.app, ["doctor", "--from", str(dump)])
    assert result.exit_code == 0, result.stdout
    assert "sapphirerapids" in result.stdout and "recommended recipe: amx" in result.stdout


def test_a_dump_without_flags_gives_unknown_not_a_verdict(tmp_path: Path) -> None:
    full = (PASTED / "linux-rocky8.5-zen4" / "lscpu-flat.en.txt").read_text()
    partial = "\n".join(line for line in full.splitlines() if not line.startswith("Flags:")) + "\n"
    report = assess(evidence.from_text(partial))
    assert report["cpu"]["features"] is None
    assert report["recipe"]["recommended"] == "unknown"
    assert any("CPU features unknown" in fact for fact in report["recipe"]["unseen"])
    dump = tmp_path / "partial.txt"
    dump.write_text(partial)
    result = CliRunner().invoke(cli.app, ["doctor", "--from", str(dump)])
    assert result.exit_code == 0, result.stdout  # nothing is wrong with the machine: it is not known
    assert "no recipe can be built" not in result.stdout
    assert "recipe.recommended" in result.stdout and "does not show" in result.stdout
    # the machine's name still comes from its model number
    assert report["cpu"]["microarchitecture"]["name"] == "zen4"


def test_a_provisional_choice_says_what_the_dump_cannot_show() -> None:
    text = (PASTED / "linux-unknown-sapphirerapids" / "lscpu-tty80.en.txt").read_bytes().decode()
    backend = assess(evidence.from_text(text))["recipe"]
    assert backend["recommended"] == "amx" and backend["provisional"]
    assert any("AMX permission" in fact for fact in backend["not_seen_by_source"])
    assert any("XCR0" in fact for fact in backend["not_seen_by_source"])


@pytest.mark.parametrize(
    "text",
    [
        "hello world\n",
        "Hardware name: QEMU Standard PC\nkernel: Linux version 6.1\n",
        "$ lscpu\nbash: lscpu: command not found\n",
        "Architektur ist schön\n",
        '{"lscpu": 3',
    ],
)
def test_text_that_is_no_dump_is_refused_with_exit_2(tmp_path: Path, text: str) -> None:
    dump = tmp_path / "notes.txt"
    dump.write_text(text)
    result = CliRunner().invoke(cli.app, ["doctor", "--from", str(dump)])
    assert result.exit_code == 2
    assert "expected" in result.output or "JSON" in result.output
    assert "Traceback" not in result.output


def test_doctor_from_refuses_what_is_no_file_or_too_large(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    big = tmp_path / "big.txt"
    with big.open("wb") as handle:  # sparse: 65 MiB of nothing
        handle.truncate(65 * 2**20)
    for path, why in (("/dev/zero", "not a regular file"), (str(fifo), "not a regular file"), (str(big), "at most")):
        done = subprocess.run(
            [sys.executable, "-m", "ktforge", "doctor", "--from", path], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2, (path, done.stderr)
        assert why in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
