"""The python code blocks of a Markdown page, run as written: the tests of the examples
the README and the docs show (tests/test_readme.py, tests/test_trainers.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
_FENCE = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Block:
    """A python block of `page`, whose code starts at `line` (1-based)."""

    page: Path
    line: int
    code: str

    def run(self, namespace: dict[str, Any]) -> None:
        """Run the block in `namespace`; a traceback names the page's own lines."""
        padded = "\n" * (self.line - 1) + self.code
        exec(compile(padded, str(self.page), "exec"), namespace)


def python_blocks(page: Path) -> list[Block]:
    """The page's ```python blocks, in order."""
    text = page.read_text()
    return [
        Block(page, text.count("\n", 0, match.start(1)) + 1, match.group(1))
        for match in _FENCE.finditer(text)
    ]
