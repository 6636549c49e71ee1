"""`sf submit` and the [job] table of the submitted directory's starforge.toml: the table gives
the defaults, options override them, and a key or value the table may not have is refused
before anything is uploaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.client.helpers import JOB, run_cli

ROOT = Path(__file__).resolve().parents[2]
FULL = """
[job]
entrypoint = "python train.py --data 'my set'"
nodes = 2
gpus = 4
gpu_type = "a100"
cpus = 16
memory = "64G"
image = "ghcr.io/acme/train:1"
env = { SEED = "1", MODE = "fast" }
cluster = "gpu"
team = "vision"
name = "big run"
priority = 5
window = "nights"
window_policy = "pause"
pending_deadline_s = 600
time_limit = "1d12h"
max_retries = 2
retry_cooldown_s = 30
then = ["eval"]

[then.eval]
entrypoint = "python eval.py"
"""


@pytest.fixture
def api(fake_api: Any, sf_env: Any) -> Any:
    sf_env(fake_api.url)
    fake_api.route("GET /api/v1/me", lambda r: (200, {"default_team": "vision"}))
    fake_api.route("POST /api/v1/snapshots", lambda r: (201, {"size": len(r.body)}))
    fake_api.route("POST /api/v1/jobs", lambda r: (201, JOB))
    return fake_api


def project(tmp_path: Path, toml: str | None) -> Path:
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "train.py").write_text("print('hi')\n")
    if toml is not None:
        (folder / "starforge.toml").write_text(toml)
    return folder


def submitted(api: Any, folder: Path, *argv: str) -> dict:
    """The job `sf submit --dir FOLDER ARGV` sent."""
    assert run_cli(["submit", "--dir", str(folder), *argv]) == 0
    create = api.requests[-1]
    assert (create.method, create.path) == ("POST", "/api/v1/jobs")
    return create.json()


def test_the_job_table_gives_every_field_and_its_entrypoint_runs(api: Any, tmp_path: Path):
    body = submitted(api, project(tmp_path, FULL))
    upload = api.requests[0]
    assert upload.path == "/api/v1/snapshots" and upload.query == {"team": "vision"}  # no /me
    assert body["entrypoint"] == ["python", "train.py", "--data", "my set"]
    assert {
        k: body[k] for k in ("nodes", "gpus_per_node", "gpu_type", "cpus", "memory", "image")
    } == {
        "nodes": 2,
        "gpus_per_node": 4,
        "gpu_type": "a100",
        "cpus": 16,
        "memory": "64G",
        "image": "ghcr.io/acme/train:1",
    }
    assert body["env"] == {"SEED": "1", "MODE": "fast"}
    assert (body["cluster"], body["team"], body["name"], body["priority"]) == (
        "gpu",
        "vision",
        "big run",
        5,
    )
    assert (body["window"], body["window_policy"], body["pending_deadline_s"]) == (
        "nights",
        "pause",
        600,
    )
    assert (body["max_retries"], body["retry_cooldown_s"], body["then"]) == (2, 30, ["eval"])
    assert body["time_limit_s"] == 36 * 3600 and "time_limit" not in body


def test_options_override_the_table_and_env_merges_over_it(api: Any, tmp_path: Path):
    argv = [
        *("--nodes", "3", "--gpus", "0", "--gpu-type", "h100", "--cpus", "4"),
        *("--memory", "512M", "--image", "repo:tag", "--team", "nlp", "--priority", "0"),
        *("--window-policy", "wait", "--max-retries", "0", "--then", "export"),
        *("--time-limit", "2:30:00"),
        *("--env", "SEED=2", "EXTRA=x", "--", "python", "other.py"),
    ]
    body = submitted(api, project(tmp_path, FULL), *argv)
    assert body["entrypoint"] == ["python", "other.py"]
    assert (body["nodes"], body["gpus_per_node"], body["gpu_type"], body["cpus"]) == (
        3,
        0,
        "h100",
        4,
    )
    assert (body["memory"], body["image"], body["team"]) == ("512M", "repo:tag", "nlp")
    # Zero and "wait" are values given, not "not given": they override the file's 5 and pause.
    assert (body["priority"], body["window_policy"], body["max_retries"]) == (0, "wait", 0)
    assert body["then"] == ["export"] and body["time_limit_s"] == 9000
    assert body["env"] == {"SEED": "2", "MODE": "fast", "EXTRA": "x"}
    assert (body["cluster"], body["retry_cooldown_s"]) == ("gpu", 30)  # not overridden


def test_without_file_or_options_the_defaults_are_todays(api: Any, tmp_path: Path):
    body = submitted(api, project(tmp_path, None), "--", "python", "train.py")
    assert (body["nodes"], body["gpus_per_node"], body["priority"]) == (1, 1, 0)
    assert (body["window_policy"], body["then"], body["env"]) == ("wait", [], {})
    fields = ("gpu_type", "cpus", "memory", "image", "cluster", "name", "max_retries")
    for field in (*fields, "time_limit_s"):
        assert body[field] is None


def test_an_entrypoint_may_be_a_list_of_strings(api: Any, tmp_path: Path):
    toml = '[job]\nentrypoint = ["python", "train.py", "--name", "a b"]\n'
    body = submitted(api, project(tmp_path, toml))
    assert body["entrypoint"] == ["python", "train.py", "--name", "a b"]
    assert (body["nodes"], body["gpus_per_node"]) == (1, 1)


def test_the_allreduce_example_needs_no_argument(api: Any):
    body = submitted(api, ROOT / "examples" / "allreduce")
    assert body["entrypoint"] == ["python", "train.py"]
    assert (body["nodes"], body["gpus_per_node"], body["name"]) == (2, 0, "allreduce")


def refused(api: Any, folder: Path, capsys: pytest.CaptureFixture, *argv: str) -> str:
    """`sf submit` exits 2 (a usage error), sends nothing, and says why on stderr."""
    assert run_cli(["submit", "--dir", str(folder), *argv]) == 2
    assert api.requests == []
    return capsys.readouterr().err


def test_an_unknown_key_is_refused_naming_it_and_the_keys(api, tmp_path, capsys):
    err = refused(api, project(tmp_path, '[job]\nentrypoint = "true"\ngpu = 2\n'), capsys)
    assert "[job] in starforge.toml has no key 'gpu'; its keys are entrypoint, nodes, gpus" in err
    assert "retry_cooldown_s, then" in err


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('nodes = "two"', "[job] nodes in starforge.toml must be a whole number, not 'two'"),
        ("nodes = 0", "[job] nodes in starforge.toml must be at least 1, not 0"),
        ("gpus = true", "[job] gpus in starforge.toml must be a whole number, not True"),
        ("gpus = 1.5", "[job] gpus in starforge.toml must be a whole number, not 1.5"),
        ("cpus = 0", "[job] cpus in starforge.toml must be at least 1, not 0"),
        ("memory = 64", "[job] memory in starforge.toml must be a size in a string"),
        ('image = ""', "[job] image in starforge.toml must be a non-empty string, not ''"),
        ("env = { A = 1 }", "[job] env in starforge.toml must be a table of strings"),
        ('env = "A=1"', "[job] env in starforge.toml must be a table of strings"),
        ('entrypoint = ""', "[job] entrypoint in starforge.toml must be a command string"),
        ('entrypoint = "python \'x"', 'with balanced quotes, not "python \'x"'),
        ('entrypoint = ["python", 3]', "[job] entrypoint in starforge.toml must be a command"),
        ('window_policy = "never"', "must be 'wait' or 'pause', not 'never'"),
        ('then = "eval"', "[job] then in starforge.toml must be a list of [then.<name>] names"),
        ("pending_deadline_s = 0", "[job] pending_deadline_s in starforge.toml must be at least 1"),
        ("max_retries = -1", "[job] max_retries in starforge.toml must be at least 0, not -1"),
        ("time_limit = 3600", "[job] time_limit in starforge.toml must be a duration with a unit"),
        ('time_limit = "60"', "must be a duration with a unit, e.g. 90m, 4h, 1d12h or 36:00:00"),
        ('time_limit = "0s"', "[job] time_limit in starforge.toml must be at least one second"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused(api, tmp_path, capsys, line: str, says: str):
    err = refused(api, project(tmp_path, f"[job]\n{line}\n"), capsys, "--", "true")
    assert says in err


def test_a_job_key_that_is_not_a_table_is_refused(api, tmp_path, capsys):
    err = refused(api, project(tmp_path, "job = 3\n"), capsys, "--", "true")
    assert "job in starforge.toml must be a table: [job]" in err


def test_a_file_that_is_not_toml_is_refused(api, tmp_path, capsys):
    err = refused(api, project(tmp_path, "[job\nnodes = 2\n"), capsys, "--", "true")
    assert "starforge.toml is not valid TOML" in err


@pytest.mark.parametrize("toml", [None, '[then.eval]\nentrypoint = "python eval.py"\n'])
def test_no_command_and_no_job_table_is_todays_error(api, tmp_path, capsys, toml):
    err = refused(api, project(tmp_path, toml), capsys)
    assert err.endswith("error: missing command after --, e.g. sf submit -- python train.py\n")


def test_a_job_table_without_an_entrypoint_needs_a_command(api, tmp_path, capsys):
    folder = project(tmp_path, "[job]\nnodes = 2\n")
    err = refused(api, folder, capsys)
    assert "missing command after --" in err and "an entrypoint in [job] of starforge.toml" in err
    assert submitted(api, folder, "--", "true")["nodes"] == 2


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--nodes", "0"], "--nodes must be >= 1"),
        (["--cpus", "0"], "--cpus must be >= 1"),
        (["--gpus", "-1"], "--gpus must be >= 0"),
    ],
)
def test_bad_options_are_usage_errors(api, tmp_path, capsys, argv: list[str], says: str):
    assert says in refused(api, project(tmp_path, FULL), capsys, *argv)


@pytest.mark.parametrize("value", ["60", "4x", "0s", "-1h", ""])
def test_a_time_limit_option_without_a_unit_or_of_nothing_is_refused(api, tmp_path, capsys, value):
    err = refused(api, project(tmp_path, None), capsys, "--time-limit", value, "--", "true")
    assert "--time-limit" in err
