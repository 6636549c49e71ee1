"""What `bench/run.py` makes of the benchmark results: medians of repeated runs, the table it
prints, and `bench/RESULTS.md` (machine, a table per area, the side-by-side comparisons).

Nothing here imports Django: it reads the JSON the benchmark children wrote.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

AREAS = [
    (
        "Scheduler",
        [
            "sched-fit",
            "sched-quota",
            "sched-gang",
            "tick-10k",
            "tick-100k",
            "sched-starvation",
            "array-10k",
        ],
    ),
    ("Log ingest, replay and the CLI", ["api", "api-s3"]),
    ("API throughput vs the framework's floor", ["http"]),
    ("Console", ["console", "live"]),
    ("Metrics", ["metrics", "mlflow"]),
    ("Usage", ["usage"]),
    ("Slurm", ["slurm-vs-sbatch", "slurm-reconcile-1000"]),
    ("Ray", ["ray-vs-jobs-api"]),
    ("Multi-node jobs", ["gang-local-failure", "slurm-multinode"]),
]


@dataclass(frozen=True)
class Row:
    bench: str
    figure: str
    measured: str
    aim: str
    ok: bool | None
    headline: tuple[str, ...] = ()  # where the row's main number sits in the bench's result


# --- medians of repeated runs ---------------------------------------------------------------


def median_of(runs: list[dict]) -> dict:
    """One result shaped like each run, every number the median of that number over the runs.

    `median_low`: with an even count it is still a figure one run measured. Lists and strings
    come from the first run (every run stays in latest.json under "runs").
    """
    first = runs[0]
    merged: dict = {}
    for key, value in first.items():
        values = [r[key] for r in runs if key in r]
        if isinstance(value, dict):
            merged[key] = median_of([v for v in values if isinstance(v, dict)])
        elif isinstance(value, int | float) and not isinstance(value, bool):
            numbers = [v for v in values if isinstance(v, int | float)]
            merged[key] = statistics.median_low(numbers)
        else:
            merged[key] = value
    return merged


def spread(runs: list[dict], path: tuple[str, ...]) -> str:
    """min–max of one number over the runs ("" for a single run or no such number)."""
    values = []
    for run in runs:
        value: object = run
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            values.append(value)
    if len(values) < 2 or not path:
        return ""
    return f"{_num(min(values))}–{_num(max(values))}"


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:,.2f}".rstrip("0").rstrip(".")


# --- rows: (figure, measured, aim, met?) per benchmark ----------------------------------------


def rows(results: dict) -> list[Row]:
    out: list[Row] = []
    for build in ROW_BUILDERS:
        out += build(results)
    return out


def _sched_rows(results: dict) -> list[Row]:
    out = []
    for name in ("sched-fit", "sched-quota", "sched-gang"):
        r = results.get(name, {})
        if "jobs_per_s" in r:
            gangs = r.get("multi_node_jobs")
            what = f", {gangs:,} 2-node gangs on {r['cluster_nodes']} nodes" if gangs else ""
            out.append(
                Row(
                    name,
                    f"schedule 10k jobs, quota {r['team_quota_gpus']}/team{what}",
                    f"{r['jobs_per_s']:,.0f} jobs/s ({r['admitted']:,} admitted in "
                    f"{r['seconds']:.2f} s: admit {r['admit_s']:.2f} s, launch "
                    f"{r['launch_s']:.2f} s; {r['ticks_with_admissions']} tick(s))",
                    ">= 500 jobs/s",
                    r["jobs_per_s"] >= 500,
                    ("jobs_per_s",),
                )
            )
    base = results.get("tick-10k", {}).get("first", {}).get("queries")
    for name in ("tick-10k", "tick-100k"):
        r = results.get(name, {})
        if "first" in r:
            first, steady = r["first"], r["steady"]
            out.append(
                Row(
                    name,
                    f"one tick, {r['queued']:,} queued",
                    f"{first['queries']} queries, {first['wall_s']:.2f} s "
                    f"({first['admitted']} admitted); steady {steady['queries']} q, "
                    f"{steady['wall_s']:.2f} s",
                    "queries flat vs 10k",
                    None if base is None else first["queries"] == base,
                    ("first", "wall_s"),
                )
            )
    r = results.get("sched-starvation", {})
    if "big_started" in r:
        limit = r["small_time_limit_s"]
        waited = r["big_waited_s"]
        out.append(
            Row(
                "sched-starvation",
                f"an 8-GPU job behind a stream of 1-GPU jobs (limit {limit} s) on 8 GPUs, "
                f"worst of {len(r['streams'])} seeded streams",
                (
                    f"started at most {waited:,.0f} s after reaching the head (each: "
                    + ", ".join(f"{s['big_waited_s']:,.0f}" for s in r["streams"])
                    + f" s); at most {r['small_jobs_started_while_it_waited']} 1-GPU jobs "
                    "started meanwhile"
                    if r["big_started"]
                    else f"not started in {r['ticks']} ticks"
                ),
                f"<= {limit} s (the 1-GPU jobs' time limit)",
                bool(r["big_started"]) and waited <= limit,
                ("big_waited_s",),
            )
        )
    r = results.get("array-10k", {})
    if "submit_s" in r:
        out.append(
            Row(
                "array-10k",
                f"a {r['tasks']:,}-task array: one POST /api/v1/arrays",
                f"{r['submit_s']:.2f} s, {r['submit_queries']} queries",
                "<= 10 s, no query per task (< 100)",
                r["submit_s"] <= 10 and r["submit_queries"] < 100,
                ("submit_s",),
            )
        )
        out.append(
            Row(
                "array-10k",
                "admitting every task (ticks and noop launches)",
                f"{r['admitted_per_s']:,.0f} tasks/s ({r['admit_all_s']:.1f} s, "
                f"{r['ticks']} ticks)",
                "no aim: for comparison with sched-fit",
                None,
                ("admitted_per_s",),
            )
        )
        capped = r["capped"]
        out.append(
            Row(
                "array-10k",
                f"a tick over the array capped at --max-parallel {capped['max_parallel']}",
                f"first {capped['first']['wall_s']:.2f} s ({capped['first']['admitted']} "
                f"admitted), steady {capped['steady']['wall_s']:.2f} s, "
                f"{capped['steady']['queries']} queries",
                "the cap kept; queries independent of the tasks",
                capped["first"]["admitted"] == capped["max_parallel"]
                and capped["steady"]["queries"] < 100,
                ("capped", "steady", "wall_s"),
            )
        )
    return out


def _api_rows(results: dict) -> list[Row]:
    return _api_rows_of(results, "api", "") + _api_rows_of(results, "api-s3", ", on S3")


def _api_rows_of(results: dict, bench: str, where: str) -> list[Row]:
    from sf.shipping import BATCH_LINES

    api, out = results.get(bench, {}), []
    for key, r in api.items():
        if key.startswith("ingest_"):
            # The aim is for the batches the runner sends; smaller ones show the per-request cost.
            runners = r["batch"] == BATCH_LINES
            out.append(
                Row(
                    bench,
                    f"ingest 1M lines, batch {r['batch']}"
                    + (" (the runner's)" if runners else "")
                    + f", {r['threads']} thread(s){where}",
                    f"{r['lines_per_s']:,} lines/s ({r['seconds']:.1f} s, {r['mb_per_s']} MB/s)",
                    ">= 100,000 lines/s" if runners else "-",
                    r["lines_per_s"] >= 100_000 if runners else None,
                    (key, "lines_per_s"),
                )
            )
    if "replay" in api:
        r = api["replay"]
        out.append(
            Row(
                bench,
                f"sf job logs -n 0 --no-follow, 1M lines{where}",
                f"{r['seconds']:.2f} s median of 3 (server alone {r['server_pages_s']:.2f} s: "
                f"page 1 {r['server_first_page_ms']} ms, last {r['server_last_full_page_ms']} ms)",
                "< 5 s",
                r["seconds"] < 5,
                ("replay", "seconds"),
            )
        )
    if "status" in api:
        r = api["status"]
        out.append(
            Row(
                bench,
                f"sf job status, {r['runs']} runs{where}",
                f"median {r['median_ms']:.0f} ms, p95 {r['p95_ms']:.0f} ms "
                f"(sf --version {r['sf_version_median_ms']:.0f} ms, "
                f"GET alone {r['http_get_job_median_ms']:.0f} ms)",
                "median < 300 ms",
                r["median_ms"] < 300,
                ("status", "median_ms"),
            )
        )
    return out


HTTP_AIMS = {"read": 0.5, "mix": 0.4}  # of the floor's requests/s


def _http_rows(results: dict) -> list[Row]:
    r = results.get("http", {})
    if "floor" not in r:
        return []
    floor = r["floor"]["read"]
    out = [
        Row(
            "http",
            f"floor: pristine Django, one PK read (SQLite), gunicorn {r['floor_workers']} sync "
            f"workers, wrk {r['connections']} connections",
            f"{floor['per_s']:,.0f} req/s, p50 {floor['p50_ms']:.0f} ms, "
            f"p99 {floor['p99_ms']:.0f} ms, {floor['errors']} error(s)",
            "-",
            None,
            ("floor", "read", "per_s"),
        )
    ]
    if "floor_postgres" in r:
        same = r["floor_postgres"]["read"]
        out.append(
            Row(
                "http",
                "the same floor on PostgreSQL (persistent connections, as production)",
                f"{same['per_s']:,.0f} req/s, p50 {same['p50_ms']:.0f} ms, "
                f"p99 {same['p99_ms']:.0f} ms, {same['errors']} error(s)",
                "-",
                None,
                ("floor_postgres", "read", "per_s"),
            )
        )
    for ledger, how in (("sqlite", "`make run` (SQLite)"), ("postgres", "production (PostgreSQL)")):
        for load, what in (("read", "job read"), ("mix", "API mix")):
            e, ratio = r[ledger][load], r[ledger][f"{load}_vs_floor"]
            same_db = r[ledger].get(f"{load}_vs_postgres_floor")
            also = f" ({same_db:.2f}x the PostgreSQL floor)" if same_db is not None else ""
            out.append(
                Row(
                    "http",
                    f"{what}, {how}, {r['web_workers']} workers, wrk {r['connections']} "
                    "connections",
                    f"{e['per_s']:,.0f} req/s = {ratio:.2f}x floor{also}, "
                    f"p50 {e['p50_ms']:.0f} ms, p99 {e['p99_ms']:.0f} ms, {e['errors']} error(s)",
                    f">= {HTTP_AIMS[load]}x floor, p99 <= 100 ms, 0 errors",
                    ratio >= HTTP_AIMS[load] and e["p99_ms"] <= 100 and e["errors"] == 0,
                    (ledger, f"{load}_vs_floor"),
                )
            )
    return out


def _console_rows(results: dict) -> list[Row]:
    console, out = results.get("console", {}), []
    for key in ("list", "list_filtered", "list_page_100", "job_page"):
        if key in console:
            r = console[key]
            out.append(
                Row(
                    "console",
                    f"console {key.replace('_', ' ')} HTML, {console['jobs']:,} jobs",
                    f"median {r['median_ms']:.0f} ms, p95 {r['p95_ms']:.0f} ms",
                    "< 150 ms",
                    r["p95_ms"] < 150,
                    (key, "median_ms"),
                )
            )
    live = results.get("live", {})
    if "p95_ms" in live:
        out.append(
            Row(
                "live",
                f"log line to browser, {live['lines']} lines",
                f"p50 {live['p50_ms']:.0f} ms, p95 {live['p95_ms']:.0f} ms",
                "p95 < 300 ms",
                live["p95_ms"] < 300,
                ("p95_ms",),
            )
        )
    return out


def _metrics_rows(results: dict) -> list[Row]:
    metrics, out = results.get("metrics", {}), []
    for key in ("series_step", "series_time"):
        if key in metrics:
            r, raw = metrics[key], metrics.get("raw_" + key, {})
            out.append(
                Row(
                    "metrics",
                    f"metrics {key.replace('_', ' x=')}, {metrics['points']:,} points",
                    f"median {r['median_ms']:.0f} ms from rollups "
                    f"(raw points {raw.get('median_ms', 0):.0f} ms)",
                    "< 150 ms",
                    r["median_ms"] < 150,
                    (key, "median_ms"),
                )
            )
    if "ingest" in metrics:
        r = metrics["ingest"]
        out.append(
            Row(
                "metrics",
                f"metrics ingest over the API, batch {r['batch']:,}, rollups included",
                f"{r['points_per_s']:,} points/s ({r['ms_per_batch']} ms per batch)",
                ">= 100,000 points/s",
                r["points_per_s"] >= 100_000,
                ("ingest", "points_per_s"),
            )
        )
    return out


def _mlflow_rows(results: dict) -> list[Row]:
    """Starforge's MLflow endpoint and a real `mlflow server` (SQLite), same client, one run."""
    r = results.get("mlflow")
    if not r:
        return []
    ours, peer = r["starforge"], r["mlflow"]
    return [
        Row(
            "mlflow",
            "MLflow log_batch ingest (1,000 metrics a request), Starforge vs mlflow server",
            f"{ours['server_points_per_s']:,.0f} vs {peer['server_points_per_s']:,.0f} points/s "
            f"({r['ingest_ratio']:.1f}x)",
            ">= 100,000 points/s and >= 5x",
            ours["server_points_per_s"] >= 100_000 and r["ingest_ratio"] >= 5,
            ("starforge", "server_points_per_s"),
        ),
        Row(
            "mlflow",
            f"MLflow get_metric_history, a page of 25,000 of {ours['server_points']:,} points",
            f"median {ours['history_page_ms']['median_ms']:.0f} ms (mlflow server: "
            f"{peer['history_page_ms']['median_ms']:.0f} ms); all pages "
            f"{ours['history_all_pages_ms']:,.0f} ms",
            "<= 150 ms",
            ours["history_page_ms"]["median_ms"] <= 150,
            ("starforge", "history_page_ms", "median_ms"),
        ),
        Row(
            "mlflow",
            "the real client's log_batch end to end (its own protobuf work included)",
            f"{ours['client_points_per_s']:,.0f} vs {peer['client_points_per_s']:,.0f} points/s",
            "-",
            None,
            ("starforge", "client_points_per_s"),
        ),
    ]


def _usage_rows(results: dict) -> list[Row]:
    usage, out = results.get("usage", {}), []
    for key in ("by_user", "by_day", "by_user_this_month"):
        if key in usage:
            r = usage[key]
            out.append(
                Row(
                    "usage",
                    f"GET /api/v1/usage {key.replace('_', ' ')}, {usage['attempts']:,} attempts",
                    f"median {r['median_ms']:.0f} ms, p95 {r['p95_ms']:.0f} ms ({r['rows']} rows)",
                    "median < 100 ms",
                    r["median_ms"] < 100,
                    (key, "median_ms"),
                )
            )
    return out


def _slurm_rows(results: dict) -> list[Row]:
    out = []
    vs = results.get("slurm-vs-sbatch", {})
    if "ratio" in vs:
        ours, direct, ratio = vs["starforge"], vs["sbatch"], vs["ratio"]
        for label, key, aim in (
            ("makespan", "makespan_s", 1.1),
            ("median submit→done", "done_median_s", 1.25),
        ):
            out.append(
                Row(
                    "slurm-vs-sbatch",
                    f"Slurm {label}, {vs['jobs']} jobs: Starforge / sbatch",
                    f"{ratio[key]}x ({ours[key]} s vs {direct[key]} s)" + _each(vs, key),
                    f"<= {aim}x",
                    ratio[key] is not None and ratio[key] <= aim,
                    ("ratio", key),
                )
            )
        out.append(
            Row(
                "slurm-vs-sbatch",
                f"Slurm median submit→RUNNING, {vs['jobs']} jobs",
                f"Starforge {ours['running_median_s']} s (p95 {ours['running_p95_s']}), "
                f"sbatch {direct['running_median_s']} s (p95 {direct['running_p95_s']})",
                "-",
                None,
                ("starforge", "running_median_s"),
            )
        )
    tick = results.get("slurm-reconcile-1000", {})
    for label in ("first", "steady"):
        if label in tick:
            r = tick[label]
            out.append(
                Row(
                    "slurm-reconcile-1000",
                    f"reconcile tick, {tick['jobs']:,} Slurm jobs ({label})",
                    f"{r['squeue_calls']} squeue, {r['wall_s']:.2f} s, {r['queries']} queries",
                    "1 squeue",
                    r["squeue_calls"] == 1,
                    (label, "wall_s"),
                )
            )
    return out


def _each(result: dict, key: str) -> str:
    """The ratio of every run the benchmark made in turn, for a side-by-side that runs several."""
    each = [run.get(key) for run in result.get("ratio_each", [])]
    return f"; runs {', '.join(f'{r}x' for r in each)}" if len(each) > 1 else ""


def _ray_rows(results: dict) -> list[Row]:
    vs = results.get("ray-vs-jobs-api", {})
    if "ratio" not in vs:
        return []
    ours, direct, ratio = vs["starforge"], vs["jobs_api"], vs["ratio"]
    out = []
    for label, key, aim in (
        ("median submit→done", "done_median_s", 1.25),
        ("makespan", "makespan_s", None),
    ):
        out.append(
            Row(
                "ray-vs-jobs-api",
                f"Ray {label}, {vs['jobs']} jobs: Starforge / JobSubmissionClient",
                f"{ratio[key]}x ({ours[key]} s vs {direct[key]} s)" + _each(vs, key),
                f"<= {aim}x" if aim else "-",
                (ratio[key] is not None and ratio[key] <= aim) if aim else None,
                ("ratio", key),
            )
        )
    return out


def _gang_rows(results: dict) -> list[Row]:
    r = results.get("gang-local-failure", {})
    if "median_s" not in r:
        return []
    return [
        Row(
            "gang-local-failure",
            f"local: one rank's failure to every rank gone, {r['ranks']} ranks",
            f"median {r['median_s']} s, max {r['max_s']} s over {r['runs']} jobs",
            "< 10 s",
            r["max_s"] < 10,
            ("median_s",),
        )
    ]


def _slurm_gang_rows(results: dict) -> list[Row]:
    r = results.get("slurm-multinode", {})
    if "ratio" not in r:
        return []
    ours, direct, ratio, fail = r["starforge"], r["sbatch"], r["ratio"], r["fail_fast"]
    runner, up = r["sbatch_runner"], "up_mean_s"
    return [
        Row(
            "slurm-multinode",
            f"Slurm {r['nodes']}-node job, mean submit→every rank up: Starforge / sbatch + srun "
            "(each with its own luck of Slurm's scheduling cycle)",
            f"{ratio[up]}x ({ours[up]} s vs {direct[up]} s, {r['jobs']} jobs each; medians "
            f"{ours['up_median_s']} s vs {direct['up_median_s']} s)",
            "-",
            None,
            ("ratio", up),
        ),
        Row(
            "slurm-multinode",
            "the same, each path's own time on the mean Slurm wait of all runs (no cycle luck)",
            f"{ratio['pooled_s']}x (own time {ours['own_mean_s']} s vs {direct['own_mean_s']} s "
            f"on a {ours['pooled_s'] - ours['own_mean_s']:.2f} s wait)",
            "<= 1.25x",
            ratio["pooled_s"] is not None and ratio["pooled_s"] <= 1.25,
            ("ratio", "pooled_s"),
        ),
        Row(
            "slurm-multinode",
            "the same vs sbatch running Starforge's runner (orchestration alone)",
            f"{r['ratio_to_runner'][up]}x ({ours[up]} s vs {runner[up]} s)",
            "-",
            None,
            ("ratio_to_runner", up),
        ),
        Row(
            "slurm-multinode",
            f"Slurm {r['nodes']}-node job, mean submit→every rank seen running",
            f"Starforge {ours['seen_mean_s']} s (ledger), sbatch {direct['seen_mean_s']} s "
            f"(squeue -s)",
            "-",
            None,
            ("starforge", "seen_mean_s"),
        ),
        Row(
            "slurm-multinode",
            f"Slurm: one rank's failure to every rank gone, {r['nodes']} nodes",
            f"median {fail['gone_median_s']} s, max {fail['gone_max_s']} s over {fail['runs']} "
            f"jobs (ledger FAILED after {fail['ledger_failed_median_s']} s)",
            "< 10 s",
            fail["gone_max_s"] < 10,
            ("fail_fast", "gone_median_s"),
        ),
    ]


ROW_BUILDERS: list[Callable[[dict], list[Row]]] = [
    _sched_rows,
    _api_rows,
    _http_rows,
    _console_rows,
    _metrics_rows,
    _mlflow_rows,
    _usage_rows,
    _slurm_rows,
    _ray_rows,
    _gang_rows,
    _slurm_gang_rows,
]


# --- the printed table ----------------------------------------------------------------------


def print_table(results: dict, failed: dict[str, str]) -> None:
    runs = results.get("runs", {})
    table = [
        (r.figure, r.measured, spread(runs.get(r.bench, []), r.headline), r.aim, _mark(r.ok))
        for r in rows(results)
    ]
    header = ("figure", "measured (median)", "range", "aim", "met")
    widths = [max([len(h)] + [len(t[i]) for t in table]) for i, h in enumerate(header)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    print("\n" + line + "\n" + "-" * len(line))
    for cells in table:
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)))
    for name, error in failed.items():
        print(f"FAILED {name}: {error}")


def _mark(ok: bool | None) -> str:
    return "-" if ok is None else ("yes" if ok else "NO")


# --- RESULTS.md -----------------------------------------------------------------------------


def markdown(results: dict, failed: dict[str, str], command: str, note: str) -> str:
    meta, runs = results["meta"], results.get("runs", {})
    repeat = meta.get("repeat", 1)
    ran = [name for name in runs]
    out = ["# Starforge benchmark results", ""]
    if note:
        out += [f"> **{note}**", ""]
    out += [
        f"Produced by `{command}` ({meta['total_s']:.0f} s in all). Benchmarks run: "
        + ", ".join(f"`{n}`" for n in ran)
        + f". Each figure is the median of {repeat} run(s) (`median_low`: a value one run "
        "measured); *range* is the min–max over the runs of the row's main number. "
        "The raw runs are in `bench/results/latest.json`; what each benchmark measures is in "
        "`bench/README.md`. To reproduce one row, run the command in its last column (PostgreSQL "
        "on 127.0.0.1:5432 and `REDIS_URL` set, as `make bench` does).",
        "",
    ]
    if meta.get("remeasured"):
        again = ", ".join(
            f"`{n}` at `{r['git']}` ({r['date']}"
            + (
                ""
                if r.get("cpu_model", meta.get("cpu_model")) == meta.get("cpu_model")
                else f", on another machine: {r['cpu_model']}; compare its rows with each "
                "other, not with the rest"
            )
            + ")"
            for n, r in meta["remeasured"].items()
        )
        out += [f"Measured again afterwards (`--only … --merge`): {again}.", ""]
    out += [
        "## Machine",
        "",
        "| | |",
        "|---|---|",
    ]
    machine = [
        ("CPU", f"{meta.get('cpu_model', '?')}, {meta['cpus']} logical CPUs"),
        ("Memory", f"{meta.get('memory_gib', '?')} GiB"),
        ("OS", meta.get("os", "?")),
        ("Python", meta["python"]),
        ("PostgreSQL", meta["postgres"]),
        ("Redis", meta.get("redis", "?")),
        ("Git revision", f"`{meta['git']}`"),
        ("Date (UTC)", meta["date"]),
        (
            "Load average (1 min) at start / end",
            f"{meta.get('load_start')} / {meta.get('load_end')}",
        ),
        ("Django DEBUG", "on" if meta["django_debug"] else "off"),
    ]
    out += [f"| {k} | {v} |" for k, v in machine]
    all_rows = rows(results)
    for area, names in AREAS:
        area_rows = [r for r in all_rows if r.bench in names]
        if not area_rows:
            continue
        out += [
            "",
            f"## {area}",
            "",
            "| figure | measured (median) | range | aim | met | command |",
        ]
        out.append("|---|---|---|---|---|---|")
        for r in area_rows:
            cmd = f"`.venv/bin/python bench/run.py --only {r.bench} --repeat {repeat}`"
            rng = spread(runs.get(r.bench, []), r.headline)
            figure = r.figure.strip()
            out.append(f"| {figure} | {r.measured} | {rng} | {r.aim} | {_mark(r.ok)} | {cmd} |")
    out += _side_by_side(results)
    if failed:
        out += ["", "## Failed", ""] + [f"- `{n}`: {e}" for n, e in failed.items()]
    return "\n".join(out) + "\n"


def _side_by_side(results: dict) -> list[str]:
    out = ["", "## Side by side"]
    vs = results.get("slurm-vs-sbatch", {})
    if "ratio" in vs:
        ours, direct = vs["starforge"], vs["sbatch"]
        out += [
            "",
            f"### Starforge on Slurm vs raw sbatch ({vs['jobs']} short jobs, seconds)",
            "",
            "| | Starforge | sbatch | Starforge / sbatch |",
            "|---|---|---|---|",
        ]
        for label, key in (
            ("makespan", "makespan_s"),
            ("submit→RUNNING median", "running_median_s"),
            ("submit→RUNNING p95", "running_p95_s"),
            ("submit→done median", "done_median_s"),
            ("submit→done p95", "done_p95_s"),
        ):
            ratio = vs["ratio"].get(key)
            if ratio is None and direct.get(key):
                ratio = round(ours[key] / direct[key], 2)
            out.append(f"| {label} | {ours.get(key)} | {direct.get(key)} | {ratio} |")
    api = results.get("api", {})
    ingest = {(r["batch"], r["threads"]): r for k, r in api.items() if k.startswith("ingest_")}
    if ingest:
        out += ["", "### Log ingest: lines/s by batch size and client threads", ""]
        threads = sorted({t for _, t in ingest})
        out += ["| batch | " + " | ".join(f"{t} thread(s)" for t in threads) + " |"]
        out += ["|---|" + "---|" * len(threads)]
        for batch in sorted({b for b, _ in ingest}, reverse=True):
            cells = [
                f"{ingest[(batch, t)]['lines_per_s']:,}" for t in threads if (batch, t) in ingest
            ]
            out.append(f"| {batch:,} | " + " | ".join(cells) + " |")
    metrics = results.get("metrics", {})
    if "series_step" in metrics:
        out += ["", "### Metrics series: rollups vs raw points (median ms)", ""]
        out += ["| series | rollups | raw points |", "|---|---|---|"]
        for key in ("series_step", "series_time"):
            raw = metrics.get("raw_" + key, {}).get("median_ms")
            out.append(f"| {key} | {metrics[key]['median_ms']} | {raw} |")
    return out if len(out) > 2 else []
