from pathlib import Path

from gpufleet.auth.policy import policy_markdown

DOC = Path(__file__).resolve().parents[1] / "docs" / "security.md"


def test_security_doc_shows_the_policy_table_of_the_code() -> None:
    text = DOC.read_text()
    start = text.index("<!-- policy-table:start -->") + len("<!-- policy-table:start -->")
    end = text.index("<!-- policy-table:end -->")
    assert text[start:end].strip() == policy_markdown().strip()
