"""The console as the browser suites drive it: carol of team vision made on a stack, a job
submitted through `sf`, signing in, and the console's text colour in each theme."""

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.e2e.stack import Stack

# The console's text colour in the dark and the light theme.
DARK_FG, LIGHT_FG = "rgb(214, 219, 228)", "rgb(29, 35, 48)"
SETUP_USERS = """
from django.contrib.auth.models import User
from jobs.actions.tokens import issue_token
from jobs.models import Cluster, Membership, Team
team = Team.objects.create(name="vision", gpu_quota=4,
                           default_cluster=Cluster.objects.get(name="local"))
carol = User.objects.create_user("carol", password="carol-pw")
Membership.objects.create(team=team, user=carol)
print(issue_token(carol))
"""


def submit(stack: Stack, token: str, workdir: Path, *command: str) -> int:
    env = {
        **os.environ,
        "SF_URL": stack.url,
        "SF_TOKEN": token,
        "SF_CONFIG": str(workdir / "sf.json"),
    }
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("sf")),
            "submit",
            "--gpus",
            "1",
            "--json",
            "--",
            *command,
        ],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)["id"]


def sign_in(page, base_url: str, username: str, password: str) -> None:
    page.goto("/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base_url}/")
