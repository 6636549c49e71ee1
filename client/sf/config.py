"""Owns the client config file (server URL and token) and its environment overrides."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

# The environment's say over the config file: another file, or the server and token themselves.
CONFIG_VAR = "SF_CONFIG"
URL_VAR = "SF_URL"
TOKEN_VAR = "SF_TOKEN"


@dataclass
class Config:
    url: str | None = None
    token: str | None = None


def config_path() -> Path:
    """Return the config file path: $SF_CONFIG, else $XDG_CONFIG_HOME/starforge/config.json."""
    override = os.environ.get(CONFIG_VAR)
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "starforge" / "config.json"


def read_file() -> dict:
    path = config_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    return data if isinstance(data, dict) else {}


def load(url: str | None = None, token: str | None = None) -> Config:
    """Resolve config with precedence: explicit args > SF_URL/SF_TOKEN env > config file."""
    data = read_file()
    return Config(
        url=url or os.environ.get(URL_VAR) or data.get("url"),
        token=token or os.environ.get(TOKEN_VAR) or data.get("token"),
    )


def save(url: str, token: str) -> Path:
    """Write the config file with mode 0600 (it holds a bearer token)."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    # Create with 0600 from the start so the token is never world-readable, even briefly.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"url": url, "token": token}, fh, indent=2)
        fh.write("\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


class ConfigError(Exception):
    """The config file exists but cannot be used."""
