"""API benchmarks against the real web server: log ingest, `sf job logs` replay, `sf job status`.

The server is granian as `make run` and production start it (`starforge.serving`, two
workers) on a free port, pointed at this child's own database and a temporary SF_VAR_DIR, and
at a real S3 server (`rclone serve s3`) with SF_BENCH_STORAGE=s3 (the `api-s3` benchmark).
Ledger rows are set up here through the ORM on the same database; everything measured goes
over HTTP (ingest) or through the real `sf` console script as a whole process (replay, status).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from bench import common

TOTAL_LINES = 1_000_000
INGEST_RUNS = [(5000, 1), (1000, 1), (5000, 2), (1000, 2)]  # (lines per batch, client threads)
STATUS_RUNS = 30
TS0 = 1_760_000_000.0


def run(var_dir: Path) -> dict:
    from jobs.actions.tokens import issue_token
    from jobs.job_tokens import job_token

    user = common.make_user()
    cluster = common.make_cluster(gpus=1000)
    (team,) = common.make_teams(1, 1000, cluster, user)
    api_token = issue_token(user, name="bench")

    out: dict = {}
    with _storage(var_dir) as storage_env, Server(var_dir, storage_env) as server:
        out["server"] = {"port": server.port, "startup_s": round(server.startup_s, 2)}
        bodies: dict[int, list[bytes]] = {}
        replay_job = None
        for batch, threads in INGEST_RUNS:
            if batch not in bodies:
                bodies.clear()  # keep one batch size in memory at a time
                bodies[batch] = _bodies(TOTAL_LINES, batch)
            jobs = [
                common.running_job(team, user, cluster, f"ingest{batch}x{threads}n{k}")
                for k in range(threads)
            ]
            tokens = [job_token(j.pk, 1) for j in jobs]
            result = _ingest(server.port, tokens, bodies[batch], TOTAL_LINES // threads)
            _check_stored(jobs, TOTAL_LINES // threads)
            out[f"ingest_b{batch}_t{threads}"] = {"batch": batch, "threads": threads, **result}
            if replay_job is None:
                replay_job = jobs[0]
        bodies.clear()

        env = _cli_env(server.port, api_token, var_dir)
        out["replay"] = _replay(replay_job.pk, env)
        out["status"] = _status(replay_job.pk, env, server.port, api_token)
    return out


@contextlib.contextmanager
def _storage(var_dir: Path) -> Iterator[dict[str, str]]:
    """The server's storage: local directories, or with SF_BENCH_STORAGE=s3 a real S3 server
    (`rclone serve s3` over a directory of var_dir) that the server keeps its logs in."""
    if os.environ.get("SF_BENCH_STORAGE", "") != "s3":
        yield {}
        return
    root = var_dir / "s3"
    (root / "bench").mkdir(parents=True)
    port = common.free_port()
    rclone = Path(sys.executable).parent / "rclone"
    server = subprocess.Popen(
        [str(rclone), "serve", "s3", str(root), "--addr", f"127.0.0.1:{port}"]
        + ["--auth-key", "bench,bench-secret", "--config", "/dev/null"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        common.wait_for_port(port, 15, lambda: server.poll() is None)
        endpoint = f"http://127.0.0.1:{port}"
        yield {"SF_STORAGE_URL": f"s3://bench:bench-secret@bench/sf?endpoint={endpoint}"}
    finally:
        server.terminate()
        server.wait(timeout=10)


class Server:
    """The real ASGI server as a subprocess (same process group as this child)."""

    def __init__(self, var_dir: Path, extra_env: dict[str, str]) -> None:
        self.var_dir, self.extra_env = var_dir, extra_env
        self.port = common.free_port()
        self.proc: subprocess.Popen | None = None
        self.startup_s = 0.0

    def __enter__(self) -> Server:
        env = {
            **os.environ,
            **self.extra_env,
            "SF_VAR_DIR": str(self.var_dir),
            "PYTHONUNBUFFERED": "1",
        }
        from starforge.serving import web_server_argv

        log = open(self.var_dir / "web.log", "wb")
        t = time.perf_counter()
        self.proc = subprocess.Popen(
            web_server_argv("127.0.0.1", self.port, workers=2),
            cwd=common.ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        try:
            common.wait_for_port(self.port, 60, alive=lambda: self.proc.poll() is None)
        except BaseException as exc:
            self.__exit__()
            raise RuntimeError(f"{exc}; server output:\n{self.log_tail()}") from exc
        self.startup_s = time.perf_counter() - t
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self) -> str:
        return (self.var_dir / "web.log").read_text(errors="replace")[-2000:]


# --- ingest --------------------------------------------------------------------------------


def _bodies(total: int, batch: int) -> list[bytes]:
    """Request bodies for seq 0..total-1, `batch` lines each (encoded before the clock starts)."""
    out = []
    for start in range(0, total, batch):
        lines = [
            {
                "seq": i,
                "stream": "stderr" if i % 50 == 49 else "stdout",
                "ts": TS0 + i * 0.001,
                "text": f"step {i:>8} | loss {1.0 / (1 + i % 977):.6f} | lr 3.0e-04 | "
                f"tokens/s {40000 + i % 4096} | gpu0 util 97%",
            }
            for i in range(start, min(total, start + batch))
        ]
        out.append(json.dumps({"attempt": 1, "lines": lines}, separators=(",", ":")).encode())
    return out


def _ingest(port: int, tokens: list[str], bodies: list[bytes], lines_each: int) -> dict:
    batch_lines = TOTAL_LINES // len(bodies)
    n_batches = lines_each // batch_lines
    errors: list[str] = []
    latencies: list[float] = []
    barrier = threading.Barrier(len(tokens) + 1)

    def client(token: str) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        barrier.wait()
        try:
            for body in bodies[:n_batches]:
                t = time.perf_counter()
                conn.request("POST", "/api/v1/ingest/logs", body=body, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
                latencies.append(time.perf_counter() - t)
                if resp.status != 200 or json.loads(raw)["accepted"] != batch_lines:
                    errors.append(f"HTTP {resp.status}: {raw[:300]!r}")
                    return
        except Exception as exc:  # report it from the main thread
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            conn.close()

    workers = [threading.Thread(target=client, args=(tok,)) for tok in tokens]
    for w in workers:
        w.start()
    barrier.wait()
    t0 = time.perf_counter()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"ingest failed: {errors[0]}")
    total = lines_each * len(tokens)
    body_mb = sum(len(b) for b in bodies[:n_batches]) * len(tokens) / 1e6
    return {
        "lines": total,
        "seconds": round(elapsed, 3),
        "lines_per_s": round(total / elapsed),
        "mb_per_s": round(body_mb / elapsed, 1),
        "request_median_ms": round(sorted(latencies)[len(latencies) // 2] * 1000, 1),
    }


def _check_stored(jobs: list, lines_each: int) -> None:
    from jobs.models import LogStream

    for job in jobs:
        stream = LogStream.objects.get(job=job, attempt=1)
        if stream.next_seq != lines_each:
            raise RuntimeError(f"job {job.pk} stored {stream.next_seq} lines, not {lines_each}")


# --- the sf client as a whole process ------------------------------------------------------


def _cli_env(port: int, token: str, var_dir: Path) -> dict[str, str]:
    return {
        **os.environ,
        "SF_URL": f"http://127.0.0.1:{port}",
        "SF_TOKEN": token,
        "SF_CONFIG": str(var_dir / "sf-config.json"),  # absent: nothing from the user's config
    }


def _sf() -> str:
    return str(Path(sys.executable).parent / "sf")


def _replay(job_id: int, env: dict[str, str]) -> dict:
    argv = [_sf(), "job", "logs", str(job_id), "-n", "0", "--no-follow"]
    # Untimed check first (also warms the page cache): every line comes back, in order.
    proc = subprocess.run(argv, env=env, capture_output=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"sf job logs failed: {proc.stderr[-500:]!r}")
    got = proc.stdout.count(b"\n") + proc.stderr.count(b"\n")
    if got != TOTAL_LINES or not proc.stdout.startswith(b"step        0 "):
        raise RuntimeError(f"sf job logs printed {got} lines, not {TOTAL_LINES}")
    runs = []
    for _ in range(3):
        t = time.perf_counter()
        with open(os.devnull, "wb") as null:
            rc = subprocess.run(argv, env=env, stdout=null, stderr=null, timeout=120).returncode
        runs.append(time.perf_counter() - t)
        if rc != 0:
            raise RuntimeError(f"sf job logs exited {rc}")
    median = sorted(runs)[1]
    return {
        "lines": TOTAL_LINES,
        "seconds": round(median, 3),
        "runs_s": [round(r, 3) for r in runs],
        "lines_per_s": round(TOTAL_LINES / median),
        **_server_pages(job_id, env),
    }


def _server_pages(job_id: int, env: dict[str, str]) -> dict:
    """The same pages fetched over one keep-alive connection: the server's share of a replay."""
    from sf.commands.logs import LOG_PAGE_LINES

    port = int(env["SF_URL"].rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Authorization": f"Bearer {env['SF_TOKEN']}"}
    query, times, lines = f"limit={LOG_PAGE_LINES}", [], 0
    while True:
        t = time.perf_counter()
        conn.request("GET", f"/api/v1/jobs/{job_id}/logs?{query}", headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        times.append(time.perf_counter() - t)
        if resp.status != 200:
            raise RuntimeError(f"GET logs: HTTP {resp.status} {raw[:300]!r}")
        page = json.loads(raw)
        lines += len(page["lines"])
        if not page["lines"]:
            break
        query = f"cursor={page['cursor']}&limit={LOG_PAGE_LINES}"
    conn.close()
    return {
        "server_pages": len(times),
        "server_pages_s": round(sum(times), 3),
        "server_first_page_ms": round(times[0] * 1000),
        "server_last_full_page_ms": round(times[-2] * 1000) if len(times) > 1 else None,
    }


def _status(job_id: int, env: dict[str, str], port: int, token: str) -> dict:
    argv = [_sf(), "job", "status", str(job_id)]
    warm = subprocess.run(argv, env=env, capture_output=True, timeout=60)
    if warm.returncode != 0 or b"RUNNING" not in warm.stdout:
        raise RuntimeError(f"sf job status failed: {warm.stdout[-300:]!r} {warm.stderr[-300:]!r}")
    whole = []
    for _ in range(STATUS_RUNS):
        t = time.perf_counter()
        rc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, timeout=60).returncode
        whole.append(time.perf_counter() - t)
        if rc != 0:
            raise RuntimeError(f"sf job status exited {rc}")
    # Where the time goes: a bare `sf --version` process, and the HTTP request alone.
    bare = []
    for _ in range(10):
        t = time.perf_counter()
        subprocess.run([_sf(), "--version"], stdout=subprocess.DEVNULL, check=True)
        bare.append(time.perf_counter() - t)
    http_only = []
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for _ in range(STATUS_RUNS):
        t = time.perf_counter()
        conn.request("GET", f"/api/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {token}"})
        resp = conn.getresponse()
        resp.read()
        http_only.append(time.perf_counter() - t)
    conn.close()
    return {
        **common.summary_ms(whole),
        "runs_ms": [round(x * 1000) for x in whole],
        "sf_version_median_ms": common.summary_ms(bare)["median_ms"],
        "http_get_job_median_ms": common.summary_ms(http_only)["median_ms"],
    }
