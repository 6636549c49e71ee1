"""A real OpenID provider for the tests: the npm `oidc-provider` package
(tests/identity/provider/, installed by `make test` with `npm ci`) run by Node on loopback.
Its accounts live in a JSON file the provider reads at every lookup, so a test changes a
person's groups, or disables them, between two sign-ins."""

import json
import shutil
import subprocess
import time
from pathlib import Path

from tests.e2e.stack import free_port

HERE = Path(__file__).resolve().parent / "provider"
INSTALL = "npm ci --prefix tests/identity/provider (part of `make test`)"
CLIENT_ID = "starforge-console"
CLIENT_SECRET = "a-client-secret-for-the-tests-only"


class OpenIdProvider:
    def __init__(self, scratch: Path, redirect_uri: str) -> None:
        if shutil.which("node") is None:
            raise RuntimeError("node is missing: install Node.js 20 (Debian's nodejs)")
        if not (HERE / "node_modules" / "oidc-provider").is_dir():
            raise RuntimeError(f"oidc-provider is not installed: run {INSTALL}")
        self.accounts_file = scratch / "accounts.json"
        self.accounts: dict[str, dict] = {}
        self._write()
        config = scratch / "provider.json"
        config.write_text(
            json.dumps(
                {
                    "client_id": CLIENT_ID,
                    "client_secret": CLIENT_SECRET,
                    "redirect_uri": redirect_uri,
                    "accounts": str(self.accounts_file),
                }
            )
        )
        self.port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.log = (scratch / "provider.log").open("w")
        self.process = subprocess.Popen(
            ["node", str(HERE / "provider.mjs"), str(self.port), str(config)],
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        self._wait_ready(scratch)

    def _wait_ready(self, scratch: Path) -> None:
        assert self.process.stdout is not None
        deadline = time.monotonic() + 20
        line = self.process.stdout.readline()
        if not line.startswith("ready") or time.monotonic() > deadline:
            self.close()
            raise RuntimeError(
                f"the provider did not start: {(scratch / 'provider.log').read_text()}"
            )

    def set_account(self, name: str, groups: list[str], disabled: bool = False) -> None:
        self.accounts[name] = {
            "email": f"{name}@example.org",
            "groups": groups,
            "disabled": disabled,
        }
        self._write()

    def _write(self) -> None:
        self.accounts_file.write_text(json.dumps(self.accounts))

    def environ(self, **extra: str) -> dict[str, str]:
        """SF_OIDC_* naming this provider, as an operator would set them."""
        return {
            "SF_OIDC_ISSUER": self.issuer,
            "SF_OIDC_CLIENT_ID": CLIENT_ID,
            "SF_OIDC_CLIENT_SECRET": CLIENT_SECRET,
            "SF_OIDC_SCOPES": "openid email profile groups",
        } | extra

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()
