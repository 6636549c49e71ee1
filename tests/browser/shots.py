"""Screenshots of the browser suites, kept where a person looks at them."""

import os
from pathlib import Path

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def shoot(page, tmp_path: Path, name: str) -> None:
    """A screenshot in tmp_path, in test-artifacts/ (for a person to look at) and in
    SF_SCREENSHOT_DIR when set; each checked non-empty."""
    folders = [tmp_path, ARTIFACTS]
    if os.environ.get("SF_SCREENSHOT_DIR"):
        folders.append(Path(os.environ["SF_SCREENSHOT_DIR"]))
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / name
        page.screenshot(path=str(path), full_page=True)
        assert path.is_file() and path.stat().st_size > 0, path
