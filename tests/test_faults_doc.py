"""docs/faults.md names, next to each claim of the README's "When things go
wrong", the tests that back it: every one it names exists."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_test_named_for_the_readmes_claims_exists():
    doc = (ROOT / "docs" / "faults.md").read_text()
    table = doc.split('## The README\'s "When things go wrong", claim by claim')[1].split("\n## ")[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) >= 8  # the header and one row a claim
    named = 0
    for row in rows[1:]:
        current = None
        for ref in re.findall(r"`([^`]+)`", row.split("|")[2]):
            path, _, test = ref.partition("::")
            if path:
                current = ROOT / path
                assert current.is_file(), ref
            if test:
                assert re.search(rf"^def {re.escape(test)}\(", current.read_text(), re.M), ref
            named += 1
        assert current is not None, row
    assert named >= 15
