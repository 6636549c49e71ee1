"""Starforge benchmarks: `make bench` (or `.venv/bin/python bench/run.py [--only NAME ...]`).

Each benchmark runs in a child process of its own, against a PostgreSQL database of its own
(created empty, migrated, dropped afterwards) and a temporary SF_VAR_DIR; a child that runs past
its time limit is killed with its whole process group (the ASGI server included). Figures are
printed as a table and written to bench/results/latest.json. See bench/README.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "bench" / "results" / "latest.json"

# name: (what it runs, time limit in seconds). The children import Django; this process does not.
BENCHES: dict[str, tuple[str, int]] = {
    "sched-fit": ("10,000 QUEUED jobs over 100 teams, every one fits its quota", 240),
    "sched-quota": ("10,000 QUEUED jobs over 100 teams, quota 60 each: 6,000 fit", 240),
    "tick-10k": ("one tick over 10,000 QUEUED jobs, 1 GPU quota per team", 180),
    "tick-100k": ("one tick over 100,000 QUEUED jobs, 1 GPU quota per team", 300),
    "api": ("log ingest, sf job logs replay, sf job status against uvicorn", 600),
    "console": ("jobs list and job page HTML with 1,000,000 jobs and 1,000,000 log lines", 600),
    "metrics": ("Charts series of 1,000,000 metric points: rollups vs raw, and ingest", 300),
    "live": ("log line latency from print() to the browser through the real stack", 300),
    "usage": ("GET /api/v1/usage for a team with 100,000 metered attempts", 300),
    "slurm-vs-sbatch": ("200 short jobs through Starforge on a real Slurm vs straight sbatch", 600),
    "slurm-reconcile-1000": ("one reconciler tick over 1,000 PENDING jobs on a real Slurm", 300),
}


def _child(name: str, out: Path) -> None:
    from bench import api_bench, common, console_bench, metrics_bench, sched

    common.django_setup()
    if name == "sched-fit":
        result = sched.throughput(10_000, quota=100)
    elif name == "sched-quota":
        result = sched.throughput(10_000, quota=60)
    elif name == "tick-10k":
        result = sched.one_tick(10_000)
    elif name == "tick-100k":
        result = sched.one_tick(100_000)
    elif name == "api":
        result = api_bench.run(Path(os.environ["SF_VAR_DIR"]))
    elif name == "console":
        result = console_bench.run()
    elif name == "live":
        from bench import live_bench

        result = live_bench.run()
    elif name == "metrics":
        result = metrics_bench.run()
    elif name == "usage":
        from bench import usage_bench

        result = usage_bench.run()
    elif name in ("slurm-vs-sbatch", "slurm-reconcile-1000"):
        from bench import slurm_bench

        result = (
            slurm_bench.vs_sbatch() if name == "slurm-vs-sbatch" else slurm_bench.reconcile_1000()
        )
    else:
        raise SystemExit(f"unknown benchmark {name!r}")
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


# --- the table -----------------------------------------------------------------------------


def _rows(results: dict) -> list[tuple[str, str, str, bool | None]]:
    """(figure, measured, aim, met?) for every benchmark that produced numbers."""
    rows: list[tuple[str, str, str, bool | None]] = []
    for name in ("sched-fit", "sched-quota"):
        r = results.get(name, {})
        if "jobs_per_s" in r:
            rows.append(
                (
                    f"schedule 10k jobs, quota {r['team_quota_gpus']}/team",
                    f"{r['jobs_per_s']:,.0f} jobs/s ({r['admitted']:,} admitted in "
                    f"{r['seconds']:.2f} s, {r['ticks_with_admissions']} tick(s))",
                    ">= 500 jobs/s",
                    r["jobs_per_s"] >= 500,
                )
            )
    ticks = {n: results.get(n, {}) for n in ("tick-10k", "tick-100k")}
    base = ticks["tick-10k"].get("first", {}).get("queries")
    for r in ticks.values():
        if "first" in r:
            first, steady = r["first"], r["steady"]
            same = None if base is None else first["queries"] == base
            rows.append(
                (
                    f"one tick, {r['queued']:,} queued",
                    f"{first['queries']} queries, {first['wall_s']:.2f} s "
                    f"({first['admitted']} admitted); steady {steady['queries']} q, "
                    f"{steady['wall_s']:.2f} s",
                    "queries flat vs 10k",
                    same,
                )
            )
    api = results.get("api", {})
    for key, r in api.items():
        if key.startswith("ingest_"):
            rows.append(
                (
                    f"ingest 1M lines, batch {r['batch']}, {r['threads']} thread(s)",
                    f"{r['lines_per_s']:,} lines/s ({r['seconds']:.1f} s, {r['mb_per_s']} MB/s)",
                    ">= 100,000 lines/s",
                    r["lines_per_s"] >= 100_000,
                )
            )
    if "replay" in api:
        r = api["replay"]
        rows.append(
            (
                "sf job logs -n 0 --no-follow, 1M lines",
                f"{r['seconds']:.2f} s median of 3 (server alone {r['server_pages_s']:.2f} s: "
                f"page 1 {r['server_first_page_ms']} ms, last {r['server_last_full_page_ms']} ms)",
                "< 5 s",
                r["seconds"] < 5,
            )
        )
    if "status" in api:
        r = api["status"]
        rows.append(
            (
                f"sf job status, {r['runs']} runs",
                f"median {r['median_ms']:.0f} ms, p95 {r['p95_ms']:.0f} ms "
                f"(sf --version {r['sf_version_median_ms']:.0f} ms, "
                f"GET alone {r['http_get_job_median_ms']:.0f} ms)",
                "median < 300 ms",
                r["median_ms"] < 300,
            )
        )
    console = results.get("console", {})
    for key in ("list", "list_filtered", "list_page_100", "job_page"):
        if key in console:
            r = console[key]
            rows.append(
                (
                    f"console {key.replace('_', ' ')} HTML, {console['jobs']:,} jobs",
                    f"median {r['median_ms']:.0f} ms, p95 {r['p95_ms']:.0f} ms",
                    "< 150 ms",
                    r["p95_ms"] < 150,
                )
            )
    metrics = results.get("metrics", {})
    for key in ("series_step", "series_time"):
        if key in metrics:
            r, raw = metrics[key], metrics.get("raw_" + key, {})
            rows.append(
                (
                    f"metrics {key.replace('_', ' x=')}, {metrics['points']:,} points",
                    f"median {r['median_ms']:.0f} ms from rollups "
                    f"(raw points {raw.get('median_ms', 0):.0f} ms)",
                    "< 150 ms",
                    r["median_ms"] < 150,
                )
            )
    if "ingest" in metrics:
        r = metrics["ingest"]
        rows.append(
            (
                f"metrics ingest, batch {r['batch']:,}, rollups included",
                f"{r['points_per_s']:,} points/s ({r['ms_per_batch']} ms per batch)",
                "-",
                None,
            )
        )
    live = results.get("live", {})
    if "p95_ms" in live:
        rows.append(
            (
                f"log line to browser, {live['lines']} lines",
                f"p50 {live['p50_ms']:.0f} ms, p95 {live['p95_ms']:.0f} ms",
                "p95 < 300 ms",
                live["p95_ms"] < 300,
            )
        )
    usage = results.get("usage", {})
    for key in ("by_user", "by_day", "by_user_this_month"):
        if key in usage:
            r = usage[key]
            rows.append(
                (
                    f"GET /api/v1/usage {key.replace('_', ' ')}, {usage['attempts']:,} attempts",
                    f"median {r['median_ms']:.0f} ms, p95 {r['p95_ms']:.0f} ms ({r['rows']} rows)",
                    "median < 100 ms",
                    r["median_ms"] < 100,
                )
            )
    rows += _slurm_rows(results)
    return rows


def _slurm_rows(results: dict) -> list[tuple[str, str, str, bool | None]]:
    rows: list[tuple[str, str, str, bool | None]] = []
    vs = results.get("slurm-vs-sbatch", {})
    if "ratio" in vs:
        ours, direct, ratio = vs["starforge"], vs["sbatch"], vs["ratio"]
        for label, key in (("makespan", "makespan_s"), ("median submit→done", "done_median_s")):
            rows.append(
                (
                    f"Slurm {label}, {vs['jobs']} jobs: Starforge / sbatch",
                    f"{ratio[key]}x ({ours[key]} s vs {direct[key]} s)",
                    "<= 1.25x",
                    ratio[key] is not None and ratio[key] <= 1.25,
                )
            )
        rows.append(
            (
                f"Slurm median submit→RUNNING, {vs['jobs']} jobs",
                f"Starforge {ours['running_median_s']} s (p95 {ours['running_p95_s']}), "
                f"sbatch {direct['running_median_s']} s (p95 {direct['running_p95_s']})",
                "-",
                None,
            )
        )
    tick = results.get("slurm-reconcile-1000", {})
    for label in ("first", "steady"):
        if label in tick:
            r = tick[label]
            rows.append(
                (
                    f"reconcile tick, {tick['jobs']:,} Slurm jobs ({label})",
                    f"{r['squeue_calls']} squeue, {r['wall_s']:.2f} s, {r['queries']} queries",
                    "1 squeue",
                    r["squeue_calls"] == 1,
                )
            )
    return rows


def _print_table(rows: list, failed: dict[str, str]) -> None:
    widths = [max(len(r[i]) for r in rows) if rows else 0 for i in range(3)]
    header = ("figure", "measured", "aim")
    widths = [max(w, len(h)) for w, h in zip(widths, header, strict=True)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + "  met"
    print("\n" + line + "\n" + "-" * len(line))
    for figure, measured, aim, ok in rows:
        mark = "-" if ok is None else ("yes" if ok else "NO")
        cells = (figure, measured, aim)
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + "  " + mark)
    for name, error in failed.items():
        print(f"FAILED {name}: {error}")


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
        "python": platform.python_version(),
        "postgres": common.server_version(),
        "django_debug": os.environ.get("SF_DEBUG", "0") == "1",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(BENCHES), help="run just these")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.out)
        return 0

    names = args.only or list(BENCHES)
    results: dict = {"meta": _meta()}
    failed: dict[str, str] = {}
    started = time.perf_counter()
    for name in names:
        what, limit = BENCHES[name]
        print(f"== {name}: {what}", flush=True)
        results[name] = _run_one(name, limit)
        if "error" in results[name]:
            failed[name] = results[name]["error"]
        print(f"   done in {results[name]['wall_s']} s", flush=True)
    results["meta"]["total_s"] = round(time.perf_counter() - started, 1)

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    _print_table(_rows(results), failed)
    print(f"\ntotal {results['meta']['total_s']} s; details in {RESULTS.relative_to(ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
