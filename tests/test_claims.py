"""docs/claims.md maps README claims to guarding tests: every test it names in its table
exists and runs in the default suite (is not marked ``slow``, nor its module)."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _named_tests():
    text = (REPO / "docs" / "claims.md").read_text()
    table = text.split("\n\nNot guarded")[0]
    return sorted(set(re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", table)))


def test_claims_table_names_existing_default_tests():
    named = _named_tests()
    assert len(named) >= 30
    for path, name in named:
        src = (REPO / path).read_text()
        assert "pytestmark = pytest.mark.slow" not in src, path
        m = re.search(rf"^((?:@.*\n)*)def {name}\(", src, re.M)
        assert m, f"{path}::{name} does not exist"
        assert "mark.slow" not in m.group(1), f"{path}::{name} is marked slow"
