#!/usr/bin/env python3
"""Regenerate installer/ktforge/data/lscpu_labels.json from util-linux's translation catalogs.

lscpu prints its field labels through gettext, so a pasted dump may say "架构\uff1a" or
"Markierungen:" where the parser expects "Architecture:" or "Flags:". This reads every
installed util-linux catalog (Debian: `apt-get install util-linux-locales`) and keeps the
translations of the labels ktforge reads. Run it when util-linux gains a language:
  python3 scripts/lscpu_labels.py
"""

from __future__ import annotations

import gettext
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "installer" / "ktforge" / "data" / "lscpu_labels.json"
CATALOGS = Path("/usr/share/locale")
# lscpu's msgids (with their colon) for the fields ktforge reads.
LABELS = [
    "Architecture:",
    "CPU(s):",
    "Vendor ID:",
    "Model name:",
    "CPU family:",
    "Model:",
    "Stepping:",
    "Flags:",
    "Hypervisor vendor:",
    "NUMA node%d CPU(s):",
]


def bare(label: str) -> str:
    """'Architecture :' / '架构\uff1a' -> 'Architecture' / '架构'."""
    return label.strip().rstrip(":\uff1a").strip()


def main() -> int:
    catalogs = sorted(CATALOGS.glob("*/LC_MESSAGES/util-linux.mo"))
    if not catalogs:
        print("lscpu_labels.py: no util-linux catalogs (apt-get install util-linux-locales)", file=sys.stderr)
        return 2
    version = subprocess.run(["lscpu", "--version"], capture_output=True, text=True).stdout.strip()
    translations: dict[str, dict[str, str]] = {bare(label): {} for label in LABELS}
    for path in catalogs:
        language = path.parent.parent.name
        with path.open("rb") as handle:
            catalog = gettext.GNUTranslations(handle)
        for label in LABELS:
            text = catalog.gettext(label)
            if text != label:
                translations[bare(label)][language] = bare(text)
    # A translated label must name one field only, whatever the language.
    owners: dict[str, str] = {}
    for field, by_language in translations.items():
        for text in {field, *by_language.values()}:
            if owners.setdefault(text.casefold(), field) != field:
                print(f"lscpu_labels.py: {text!r} names both {owners[text.casefold()]} and {field}", file=sys.stderr)
                return 1
    document = {
        "source": f"util-linux translation catalogs ({version}), {len(catalogs)} languages; "
        "regenerate with scripts/lscpu_labels.py",
        "labels": translations,
    }
    OUTPUT.write_text(json.dumps(document, ensure_ascii=False, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUTPUT.relative_to(ROOT)}: {sum(len(v) for v in translations.values())} translations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
