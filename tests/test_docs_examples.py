"""The API examples of the README and the documentation type-check against the code (mypy --strict, the project's
own configuration): every ```python block, a page's blocks in order as one module."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
EXAMPLES = {str(p.relative_to(ROOT)): "\n".join(BLOCK.findall(p.read_text(encoding="utf-8"))) for p in PAGES}


def test_the_pages_that_show_the_api_have_examples() -> None:
    """The extraction itself: the README and the API page show the Registry (or the convention broke)."""
    assert "Registry(" in EXAMPLES["README.md"] and "Registry(" in EXAMPLES["docs/python-api.md"]


@pytest.mark.parametrize("page", sorted(name for name, code in EXAMPLES.items() if code))
def test_the_examples_type_check(page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    api = pytest.importorskip("mypy.api", reason="mypy is installed by the lint session, which runs this test")
    module = tmp_path / (re.sub(r"\W", "_", page.removesuffix(".md")) + ".py")
    module.write_text(EXAMPLES[page], encoding="utf-8")
    monkeypatch.setenv("MYPYPATH", str(ROOT))  # this checkout's packages, not an installed copy
    monkeypatch.chdir(ROOT)  # the lint session's mypy cache: only the example is checked anew
    out, err, status = api.run(["--config-file", str(ROOT / "pyproject.toml"), "--no-error-summary", str(module)])
    assert status == 0, f"{page}'s python blocks do not type-check:\n{out}{err}"
