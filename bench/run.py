"""Starforge benchmarks: `make bench` (or `.venv/bin/python bench/run.py [--only NAME ...]`).

Each benchmark runs in a child process of its own, against a PostgreSQL database of its own
(created empty, migrated, dropped afterwards) and a temporary SF_VAR_DIR; a child that runs past
its time limit is killed with its whole process group (the ASGI server included). With
`--repeat N` each benchmark runs N times and every figure is the median of its runs. Figures are
printed as a table and written to bench/RESULTS.md (the report) and bench/results/latest.json
(every run). See bench/README.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "bench" / "results" / "latest.json"
MARKDOWN = ROOT / "bench" / "RESULTS.md"

# name: (what it runs, time limit in seconds). The children import Django; this process does not.
BENCHES: dict[str, tuple[str, int]] = {
    "sched-fit": ("10,000 QUEUED jobs over 100 teams, every one fits its quota", 240),
    "sched-quota": ("10,000 QUEUED jobs over 100 teams, quota 60 each: 6,000 fit", 240),
    "sched-gang": ("10,000 QUEUED jobs, every 10th a 2-node gang, on 200 nodes", 240),
    "tick-10k": ("one tick over 10,000 QUEUED jobs, 1 GPU quota per team", 180),
    "tick-100k": ("one tick over 100,000 QUEUED jobs, 1 GPU quota per team", 300),
    "sched-starvation": ("an 8-GPU job behind a steady stream of 1-GPU jobs: its wait", 240),
    "array-10k": ("a 10,000-task array: submit in one request, then admit every task", 300),
    "api": ("log ingest, sf job logs replay, sf job status against the web server", 600),
    "api-s3": ("the same with snapshots and logs on a real S3 server (rclone serve s3)", 600),
    "console": ("jobs list and job page HTML with 1,000,000 jobs and 1,000,000 log lines", 600),
    "metrics": ("Charts series of 1,000,000 metric points: rollups vs raw, and ingest", 300),
    "live": ("log line latency from print() to the browser through the real stack", 300),
    "usage": ("GET /api/v1/usage for a team with 100,000 metered attempts", 300),
    "http": ("wrk, 50 connections: a job read and the API mix vs a pristine Django's", 420),
    "slurm-vs-sbatch": ("200 short jobs through Starforge on a real Slurm vs sbatch, 3 runs", 1200),
    "ray-vs-jobs-api": (
        "8 short jobs through Starforge on a real Ray vs its Jobs API, 3 runs",
        900,
    ),
    "slurm-reconcile-1000": ("one reconciler tick over 1,000 PENDING jobs on a real Slurm", 300),
    "gang-local-failure": ("local 2-rank jobs: one rank's failure to every rank gone", 120),
    "slurm-multinode": ("2-node jobs on a real 2-node Slurm vs sbatch --nodes 2; fail fast", 600),
    "mlflow": ("MLflow log_batch and get_metric_history: Starforge vs mlflow server (SQLite)", 900),
    "activity": ("activity reports ingested (samples/s) and the watch's tick over 1,000 jobs", 300),
}


def _benchmark(name: str) -> Callable[[], dict]:
    """The function that runs benchmark `name` (each module imported only when its turn comes)."""
    from bench import sched

    def of(module: str, function: str, *args) -> Callable[[], dict]:
        return lambda: getattr(importlib.import_module(f"bench.{module}"), function)(*args)

    table = {
        "sched-fit": lambda: sched.throughput(10_000, quota=100),
        "sched-quota": lambda: sched.throughput(10_000, quota=60),
        "sched-gang": lambda: sched.throughput(10_000, quota=120, gang_every=10),
        "tick-10k": lambda: sched.one_tick(10_000),
        "tick-100k": lambda: sched.one_tick(100_000),
        "sched-starvation": sched.starvation,
        "array-10k": sched.array_10k,
        "api": lambda: of("api_bench", "run", Path(os.environ["SF_VAR_DIR"]))(),
        "api-s3": lambda: of("api_bench", "run", Path(os.environ["SF_VAR_DIR"]))(),
        "console": of("console_bench", "run"),
        "live": of("live_bench", "run"),
        "metrics": of("metrics_bench", "run"),
        "usage": of("usage_bench", "run"),
        "http": of("http_bench", "run"),
        "slurm-vs-sbatch": of("slurm_bench", "vs_sbatch"),
        "slurm-reconcile-1000": of("slurm_bench", "reconcile_1000"),
        "ray-vs-jobs-api": of("ray_bench", "vs_jobs_api"),
        "gang-local-failure": of("gang_bench", "local_rank_failure"),
        "slurm-multinode": of("slurm_bench", "multinode"),
        "mlflow": of("mlflow_bench", "run"),
        "activity": of("activity_bench", "run"),
    }
    if name not in table:
        raise SystemExit(f"unknown benchmark {name!r}")
    return table[name]


def _child(name: str, out: Path) -> None:
    from bench import common

    common.django_setup()
    if name == "api-s3":
        os.environ["SF_BENCH_STORAGE"] = "s3"
    result = _benchmark(name)()
    from django.db import connections

    connections.close_all()  # so the orchestrator can drop the database right away
    out.write_text(json.dumps(result, indent=2))


def _run_one(name: str, limit: int) -> dict:
    from bench import common

    db = "sf_bench_" + name.replace("-", "_")
    var_dir = Path(tempfile.mkdtemp(prefix=f"sf-bench-{name}-"))
    out = var_dir / "result.json"
    env = {
        **os.environ,
        "DATABASE_URL": common.db_url(db),
        "SF_VAR_DIR": str(var_dir),
        "DJANGO_SETTINGS_MODULE": "starforge.settings",
        "SF_DEBUG": os.environ.get("SF_DEBUG", "0"),
        "SF_LOG_LEVEL": os.environ.get("SF_LOG_LEVEL", "WARNING"),
        "PYTHONUNBUFFERED": "1",
    }
    common.create_db(db)
    t = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", name, "--out", str(out)],
        cwd=ROOT,
        env=env,
        start_new_session=True,  # its own process group: killing it reaches the server too
    )
    try:
        rc = proc.wait(timeout=limit)
        error = None if rc == 0 else f"exited with status {rc}"
    except subprocess.TimeoutExpired:
        error = f"ran past its {limit} s limit and was killed"
    finally:
        _kill_group(proc)
        common.drop_db(db)
    wall = time.perf_counter() - t
    try:
        result = json.loads(out.read_text()) if error is None else {}
    finally:
        shutil.rmtree(var_dir, ignore_errors=True)
    result["wall_s"] = round(wall, 1)
    if error:
        result["error"] = error
    return result


def _kill_group(proc: subprocess.Popen) -> None:
    """End the child and anything it started (same process group), politely first."""
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:  # the child is gone; wait for its children too
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


# --- the machine -----------------------------------------------------------------------------


def _meta() -> dict:
    from bench import common

    rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "git": rev + ("-dirty" if dirty else ""),
        "cpus": os.cpu_count(),
        "cpu_model": _proc_field("/proc/cpuinfo", "model name") or platform.processor(),
        "memory_gib": round(int(_proc_field("/proc/meminfo", "MemTotal").split()[0]) / 2**20, 1)
        if _proc_field("/proc/meminfo", "MemTotal")
        else None,
        "os": _os_name(),
        "python": platform.python_version(),
        "postgres": common.server_version(),
        "redis": _redis_version(),
        "django_debug": os.environ.get("SF_DEBUG", "0") == "1",
        "load_start": round(os.getloadavg()[0], 2),
    }


def _proc_field(path: str, name: str) -> str:
    try:
        for line in Path(path).read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == name:
                return value.strip()
    except OSError:
        pass
    return ""


def _os_name() -> str:
    try:
        release = dict(
            line.split("=", 1)
            for line in Path("/etc/os-release").read_text().splitlines()
            if "=" in line
        )
        pretty = release.get("PRETTY_NAME", "").strip('"')
    except OSError:
        pretty = ""
    return f"{pretty or platform.system()} (kernel {platform.release()})"


def _redis_version() -> str | None:
    try:
        import redis

        client = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
        return str(client.info("server")["redis_version"])
    except Exception:  # the figures do not need it; the report says "?"
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(BENCHES), help="run just these")
    parser.add_argument(
        "--repeat", type=int, default=1, help="run each benchmark N times; report the medians"
    )
    parser.add_argument(
        "--note", default="", help="a line for the top of RESULTS.md (a partial run, a busy box)"
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the other benchmarks of the last results and replace only these (with --only)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.out)
        return 0

    from bench import report

    names = args.only or list(BENCHES)
    results: dict = {"meta": {**_meta(), "repeat": args.repeat}}
    runs: dict[str, list[dict]] = {}
    if args.merge:
        if not args.only or not RESULTS.exists():
            parser.error("--merge needs --only and an earlier bench/results/latest.json")
        results, runs = _kept(json.loads(RESULTS.read_text()), names, results["meta"])
    failed: dict[str, str] = {}
    started = time.perf_counter()
    for name in names:
        what, limit = BENCHES[name]
        runs[name] = []
        for i in range(args.repeat):
            print(f"== {name} ({i + 1}/{args.repeat}): {what}", flush=True)
            load = round(os.getloadavg()[0], 2)
            runs[name].append({**_run_one(name, limit), "load_1m_before": load})
            print(f"   done in {runs[name][-1]['wall_s']} s", flush=True)
            if "error" in runs[name][-1]:
                failed[name] = runs[name][-1]["error"]
                break  # a broken benchmark stays broken: on to the next one
        measured = [r for r in runs[name] if "error" not in r]
        results[name] = report.median_of(measured) if measured else {}
        if name in failed:
            results[name]["error"] = failed[name]
        # Written after every benchmark: a run cut short still leaves a report of what it did.
        done = len(runs)
        note = args.note
        if done < len(names):
            note = (
                f"Unfinished: {done} of the {len(names)} benchmarks asked for have run so far "
                f"(next: {', '.join(names[done:])})." + (f" {note}" if note else "")
            )
        _write(results, runs, failed, started, note)
    report.print_table(results, failed)
    print(
        f"\ntotal {results['meta']['total_s']} s; {MARKDOWN.relative_to(ROOT)}, raw runs in "
        f"{RESULTS.relative_to(ROOT)}"
    )
    return 1 if failed else 0


def _kept(earlier: dict, names: list[str], meta: dict) -> tuple[dict, dict]:
    """The earlier results without `names`, whose machine and revision stay the report's, and
    the revision and date each of `names` is measured again at."""
    runs = {name: r for name, r in earlier.pop("runs", {}).items() if name not in names}
    results = {name: r for name, r in earlier.items() if name not in names}
    again = {
        name: {"git": meta["git"], "date": meta["date"], "cpu_model": meta.get("cpu_model")}
        for name in names
    }
    results["meta"]["remeasured"] = {**results["meta"].get("remeasured", {}), **again}
    return results, runs


def _write(results: dict, runs: dict, failed: dict, started: float, note: str) -> None:
    from bench import report

    meta = results["meta"]
    if "remeasured" not in meta:  # a merged report keeps the first run's command and time
        meta["total_s"] = round(time.perf_counter() - started, 1)
        meta["load_end"] = round(os.getloadavg()[0], 2)
        meta["command"] = shlex.join(["bench/run.py", *sys.argv[1:]])
    results["runs"] = runs
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    MARKDOWN.write_text(report.markdown(results, failed, meta["command"], note))


if __name__ == "__main__":
    sys.exit(main())
