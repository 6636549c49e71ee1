"""Config file location, precedence and permissions."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from sf import config


def test_config_lives_under_xdg_config_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("SF_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert config.config_path() == tmp_path / "starforge" / "config.json"


def test_saved_config_is_private_and_env_overrides_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SF_CONFIG", str(tmp_path / "nested" / "c.json"))
    monkeypatch.delenv("SF_URL", raising=False)
    monkeypatch.setenv("SF_TOKEN", "from-env")
    path = config.save("http://file", "from-file")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    cfg = config.load()
    assert (cfg.url, cfg.token) == ("http://file", "from-env")
    assert config.load(token="explicit").token == "explicit"
