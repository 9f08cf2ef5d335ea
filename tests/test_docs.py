"""The documentation builds: `mkdocs build --strict` fails on a broken link, a page missing from
the navigation, or an API reference that names something the package does not have."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "site" / "api" / "index.html").exists()


def test_readme_is_for_users() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.encode()) <= 12 * 1024
    # the two commands come first: the main job, then the tests
    blocks = readme.split("```bash\n")
    assert "pydflash2 generate" in blocks[1] and ".venv/bin/pytest" in blocks[2]
