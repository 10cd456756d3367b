"""The per-distribution package table that ./install.sh deps uses."""

from __future__ import annotations

import pytest

from ktforge.builder import sysdeps


@pytest.mark.parametrize(
    ("ids", "manager", "cxx"),
    [
        (["ubuntu", "debian"], "apt-get", "g++"),
        (["debian"], "apt-get", "g++"),
        (["rocky", "rhel", "centos", "fedora"], "dnf", "gcc-c++"),
        (["fedora"], "dnf", "gcc-c++"),
        (["arch"], "pacman", "gcc"),
        (["opensuse-leap", "suse", "opensuse"], "zypper", "gcc-c++"),
    ],
)
def test_every_family_has_a_command(ids: list[str], manager: str, cxx: str) -> None:
    *_, install = sysdeps.commands(["cxx", "cmake", "headers"], ids)
    assert manager in install and install[-3] == cxx
    assert "cmake" in install


def test_unknown_distribution_is_reported() -> None:
    with pytest.raises(LookupError, match="unknown distribution gentoo"):
        sysdeps.commands(["cxx"], ["gentoo"])


def test_main_prints_this_distribution_s_commands(capsys: pytest.CaptureFixture[str]) -> None:
    found = sysdeps.family(sysdeps.distribution_ids())
    assert found is not None
    _, entry = found
    assert sysdeps.main(["cxx", "cmake"]) == 0
    out = capsys.readouterr().out
    assert " ".join(entry["install"]) in out and entry["packages"]["cxx"] in out


def test_this_machine_is_known() -> None:
    ids = sysdeps.distribution_ids()
    assert ids and sysdeps.family(ids) is not None
