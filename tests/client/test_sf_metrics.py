"""The metrics SDK (sf.log, sf.log_validation) and the runner shipping its points."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from sf import metrics, shipping

from tests.client.helpers import exit_record, pack, run_runner, runner_env


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k != metrics.ENV_FILE}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def read_points(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize(
    ("metrics_arg", "step", "fragment"),
    [
        ([("loss", 1.0)], None, "must be a dict"),
        ({"": 1.0}, None, "non-empty string"),
        ({"x" * 101: 1.0}, None, "at most 100 characters"),
        ({3: 1.0}, None, "non-empty string"),
        ({"ok": True}, None, "must be a number, not bool"),
        ({"loss": "0.3"}, None, "must be a number, not str"),
        ({"loss": math.nan}, None, "only finite numbers"),
        ({"loss": -math.inf}, None, "only finite numbers"),
        ({"loss": 1.0}, -1, "non-negative int"),
        ({"loss": 1.0}, 1.5, "non-negative int"),
        ({"loss": 1.0}, True, "non-negative int"),
    ],
)
def test_bad_input_raises_value_error_with_a_sentence(
    tmp_path: Path, metrics_arg: Any, step: Any, fragment: str
) -> None:
    writer = metrics.MetricsWriter(str(tmp_path / "metrics.jsonl"))
    with pytest.raises(ValueError, match=fragment):
        writer.log("train", metrics_arg, step)
    writer.flush()
    assert not (tmp_path / "metrics.jsonl").exists()


def test_a_bad_value_refuses_the_whole_call(tmp_path: Path) -> None:
    writer = metrics.MetricsWriter(str(tmp_path / "metrics.jsonl"))
    with pytest.raises(ValueError):
        writer.log("train", {"loss": 0.5, "lr": math.nan}, 1)
    assert writer.buffer == []


def test_outside_starforge_log_is_a_noop_that_warns_once() -> None:
    result = run_python(
        """
        import sys, warnings
        warnings.simplefilter("always")
        import sf
        assert "sf.metrics" not in sys.modules  # `import sf` stays cheap
        sf.log({"loss": 0.3}, step=1)
        sf.log({"loss": 0.2})
        sf.log_validation({"accuracy": 0.9})
        try:
            sf.log({"loss": float("nan")})
        except ValueError as exc:
            print("refused:", exc)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("not running under Starforge") == 1
    assert "<string>:6" in result.stderr  # the warning points at the caller's line
    assert "refused: metric 'loss' is nan" in result.stdout  # validated even when a no-op


def test_points_are_json_lines_with_a_per_kind_step_counter(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    result = run_python(
        """
        import sf
        sf.log({"loss": 0.31, "lr": 3e-4}, step=120)
        sf.log({"loss": 0.29})
        sf.log_validation({"accuracy": 0.91})
        sf.log_validation({"accuracy": 0.93}, step=1000)
        """,
        SF_METRICS_FILE=str(path),
    )
    assert result.returncode == 0, result.stderr
    points = read_points(path)  # written by the exit-time flush
    assert [(p["kind"], p["name"], p["step"], p["value"]) for p in points] == [
        ("train", "loss", 120, 0.31),
        ("train", "lr", 120, 3e-4),
        ("train", "loss", 121, 0.29),
        ("validation", "accuracy", 0, 0.91),
        ("validation", "accuracy", 1000, 0.93),
    ]
    assert all(set(p) == {"kind", "name", "step", "value", "ts"} for p in points)
    assert abs(points[0]["ts"] - time.time()) < 60 and points[0]["ts"] == points[1]["ts"]


def test_points_are_flushed_at_200_and_by_the_timer(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    writer = metrics.MetricsWriter(str(path))
    writer.log("train", {f"m{i}": float(i) for i in range(200)}, 0)
    assert len(read_points(path)) == 200  # at once, not after the interval
    writer.log("validation", {"accuracy": 0.5}, 7)
    deadline = time.monotonic() + 5
    while len(read_points(path)) < 201 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert read_points(path)[-1] == {**read_points(path)[-1], "name": "accuracy", "step": 7}


def test_lines_from_concurrent_processes_never_interleave(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    code = """
        import sf
        for i in range(3000):
            sf.log({"a_rather_long_metric_name_to_make_lines_longer": i / 7, "b": i}, step=i)
    """
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)],
            env={**os.environ, "SF_METRICS_FILE": str(path)},
        )
        for _ in range(3)
    ]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0]
    points = read_points(path)  # every line parses
    assert len(points) == 3 * 3000 * 2


# -- the runner's side ---------------------------------------------------------------------------

JOB_SCRIPT = """\
import os
import sf
for step in range(500):
    sf.log({"loss": 1.0 / (step + 1), "lr": 3e-4}, step=step)
sf.log_validation({"accuracy": 0.91}, step=499)
with open(os.environ["SF_METRICS_FILE"], "a") as fh:
    fh.write("this is not a metric point\\n")
"""


class MetricsSink:
    """Fake metrics ingest: fails the first `fail` POSTs with 503, then dedupes by seq."""

    def __init__(self, exit_file: Path, fail: int = 1) -> None:
        self.exit_file, self.fail = exit_file, fail
        self.stored: dict[int, dict] = {}
        self.posts, self.duplicates, self.after_exit_file = 0, 0, 0

    def __call__(self, req: Any) -> tuple[int, Any]:
        self.posts += 1
        self.after_exit_file += self.exit_file.exists()
        if self.posts <= self.fail:
            return 503, {"detail": "database is busy."}
        body = req.json()
        assert body["attempt"] == 1
        new = [p for p in body["points"] if p["seq"] not in self.stored]
        self.stored.update((p["seq"], p) for p in new)
        self.duplicates += len(body["points"]) - len(new)
        return 200, {"accepted": len(new), "duplicates": len(body["points"]) - len(new)}


def test_runner_ships_every_point_once_across_a_503_before_the_exit_file(
    fake_api: Any, tmp_path: Path
) -> None:
    sha, data = pack(tmp_path, {"job.py": JOB_SCRIPT})
    env = runner_env(tmp_path, fake_api.url, sha, [sys.executable, "job.py"])
    sink = MetricsSink(Path(env["SF_EXIT_FILE"]), fail=1)
    fake_api.route("GET /api/v1/ingest/snapshot", lambda r: (200, data))
    fake_api.route("POST /api/v1/ingest/logs", lambda r: (200, {"next_seq": 0}))
    fake_api.route("POST /api/v1/ingest/metrics", sink)
    result = run_runner(env)
    assert result.returncode == 0, result.stderr
    assert sorted(sink.stored) == list(range(len(sink.stored)))  # one numbering, no gaps
    assert sink.posts >= 2 and sink.duplicates == 0 and sink.after_exit_file == 0
    # The runner's own system samples share the numbering; the SDK's points keep their order.
    points = [p for _, p in sorted(sink.stored.items()) if p["kind"] != "system"]
    assert len(points) == 1001  # 500 x 2 train + 1 validation
    assert [p["step"] for p in points if p["name"] == "loss"] == list(range(500))
    assert points[-1] | {"ts": 0, "seq": 0} == {
        "seq": 0,
        "kind": "validation",
        "name": "accuracy",
        "step": 499,
        "value": 0.91,
        "ts": 0,
    }
    assert "skipped 1 lines" in result.stderr
    assert exit_record(env)["exit_code"] == 0
    metrics_file = Path(env["SF_EXIT_FILE"]).parent / "metrics.jsonl"
    assert len(metrics_file.read_text().splitlines()) == 1002


@pytest.mark.parametrize(
    "line",
    [
        b"not json",
        b"[1, 2]",
        b'{"kind": "eval", "name": "a", "step": 1, "value": 1.0, "ts": 1.0}',
        b'{"kind": "train", "name": "", "step": 1, "value": 1.0, "ts": 1.0}',
        b'{"kind": "train", "name": "a", "step": -1, "value": 1.0, "ts": 1.0}',
        b'{"kind": "train", "name": "a", "step": 1, "value": true, "ts": 1.0}',
        b'{"kind": "train", "name": "a", "step": 1, "value": NaN, "ts": 1.0}',
        b'{"kind": "train", "name": "a", "step": 1, "value": 1.0}',
    ],
)
def test_the_runner_skips_lines_that_are_not_points(line: bytes) -> None:
    assert shipping.parse_point(line) is None


def test_metrics_shipping_stops_on_410(capfd: pytest.CaptureFixture) -> None:
    from sf.http import ApiError

    class Refusing:
        def __init__(self) -> None:
            self.paths: list[str] = []

        def request(self, method: str, path: str, json_body: Any = None, **_: Any) -> Any:
            self.paths.append(path)
            raise ApiError(410, "attempt 1 of job 7 is over.")

    client = Refusing()
    shipper = shipping.MetricsShipper(client, attempt=1)  # type: ignore[arg-type]
    shipper.add({"seq": 0, "kind": "train", "name": "loss", "step": 0, "value": 1.0, "ts": 0.0})
    shipper.start()
    shipper.close()
    assert client.paths == ["/api/v1/ingest/metrics"] and shipper.buffer == []
    assert "shipping metric points stopped: HTTP 410" in capfd.readouterr().err
