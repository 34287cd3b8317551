"""Source files state their rules themselves: a comment that points at a document outside the repository
(the project's style or spec notes, a shared folder) says nothing to a reader of the package alone."""

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "blockdraft"
OUTSIDE = re.compile(r"\bSTYLE\b|\bSPEC(?:\.md)?\s*(?:§|section|principle)|SPEC\.md|\bshared/|/work/")


def outside_references(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if OUTSIDE.search(line)]


def test_no_source_file_cites_a_document_outside_the_repository():
    found = {str(path.relative_to(PACKAGE)): hits for path in sorted(PACKAGE.rglob("*"))
             if path.suffix in (".py", ".cpp", ".md") and (hits := outside_references(path.read_text()))}
    assert not found, f"say the rule itself instead of citing an outside document: {found}"


def test_the_check_sees_a_planted_reference():
    for planted in ("# the gate (STYLE 16)", '"""shapes (SPEC §2)"""', "# see /work/shared/notes.md",
                    "# as SPEC.md says"):
        assert outside_references(f"x = 1\n{planted}\n"), planted
    for fine in ('metavar="SPEC"', "# `--method SPEC` picks the drafter", "# DeLS §5.1: alpha = 0.3"):
        assert not outside_references(fine), fine


def _attributes_named(tree, name: str) -> list[int]:
    import ast
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr == name and isinstance(node.ctx, ast.Store)]


def test_rows_means_row_ids_in_the_drafters():
    """A rows cache's `rows` are the row ids decoding; a drafter's per-sequence state, a headed drafter's
    backbone state and a head's draft-to-target ids carry their own names (`sequence_state`,
    `backbone_state`, `d2t`), so `.rows` never holds a DFlashRows or a tensor."""
    import ast
    found = {str(path.relative_to(PACKAGE)): lines for path in sorted((PACKAGE / "drafters").rglob("*.py"))
             if (lines := _attributes_named(ast.parse(path.read_text()), "rows"))}
    assert not found, f"an attribute named rows that is not the row ids: {found}"
    assert _attributes_named(ast.parse("class A:\n    def f(self):\n        self.rows = None\n"), "rows") == [3]
