"""Import boundaries (DESIGN.md): what a fresh interpreter loads when it runs some code of the project."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def packages_loaded(code: str, packages: tuple[str, ...]) -> list[str]:
    """Run `code` in a new interpreter at the repo root; return which of `packages` it loaded (with any module of
    theirs). Raises if the code itself fails."""
    probe = (f"import json, sys\n{code}\n"
             f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({sorted(packages)!r}))))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])
