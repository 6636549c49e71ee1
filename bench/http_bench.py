"""HTTP throughput of the API next to the framework's floor, with a C load generator (wrk).

One run measures, one after another on this machine:

- the floor: a pristine Django project (`django-admin startproject`, its default settings and
  middleware with DEBUG off) whose one view reads one row by primary key from its SQLite
  database, under gunicorn with one sync worker per core; the ratios' denominator;
- the same floor on PostgreSQL (its own database on the same server, with the persistent
  connections Starforge's production settings use: a pristine project's CONN_MAX_AGE=0 would
  open a connection per request and flatter Starforge), which says how much of the PostgreSQL
  figures is the database's own cost on these cores;
- Starforge as `make run` starts it: `manage.py runstack` on the embedded SQLite ledger;
- Starforge as production starts it: `starforge.settings_prod` on this child's PostgreSQL
  database, the web and websocket servers of `starforge.serving`, a Celery worker and beat.

Both Starforges run SF_WEB_WORKERS web workers (granian, one per core, at least 2), the floor
gunicorn's sync workers, one per core; the Celery worker and beat tick beside them, as they do
in use.

Each Starforge holds JOBS jobs of one team on a `noop` cluster, half admitted and launched so
their timelines have events, the other half held QUEUED by the team's quota (every tick reads
them; wrk's submits ask for no GPUs, so they are admitted all the same). wrk drives CONNECTIONS
connections for DURATION_S (after an unmeasured warm-up) on a job read alone (the floor: its one
read) and on the mix, a Lua script that rotates job list, job read, events, usage and submit with
the user's API token. Figures:
requests/s, p50, p99 and max latency, errors (answers of 400 and over, socket errors,
timeouts), each rate over the floor's, and `cpu_ms_per_request`: the CPU time the servers'
processes spent during the measured run, by role (web, websocket, worker, beat, redis), over
the requests served (PostgreSQL's own processes and wrk's are not counted).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import common  # noqa: E402

CONNECTIONS = 50
DURATION_S = 10
WARM_UP_S = 2
JOBS = 2_000
FLOOR_DB = "sf_bench_http_floor"
# One rotation of the mix, what a console and a few CLIs polling mostly do: read.
MIX = ["list", "read", "list", "events", "read", "list", "usage", "read", "events", "submit"]
FLOOR_URLS = textwrap.dedent(
    """
    from django.contrib.auth.models import User
    from django.http import JsonResponse
    from django.urls import path


    def read(request, pk):
        user = User.objects.get(pk=pk)
        return JsonResponse({"id": user.pk, "username": user.username})


    urlpatterns = [path("read/<int:pk>", read)]
    """
)
REPORT = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests": %d, "duration_us": %d, "connect": %d, "read": %d, "write": %d, ' ..
    '"status": %d, "timeout": %d, "p50_us": %d, "p99_us": %d, "max_us": %d}\\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99), latency.max))
end
"""


def run() -> dict:
    """The benchmark child: Django is set up on this child's PostgreSQL database."""
    from django.conf import settings

    wrk = _wrk()
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="sf-http-") as tmp:
        work = Path(tmp)
        floor = _floor(work / "floor", wrk, cores)
        floor_postgres = _floor(work / "floor-postgres", wrk, cores, postgres=True)
        sqlite = _embedded(work / "embedded", wrk)
        postgres = _production(work / "production", wrk, settings.SF_WEB_WORKERS)
    out = {
        "connections": CONNECTIONS,
        "duration_s": DURATION_S,
        "floor_workers": cores,
        "web_workers": settings.SF_WEB_WORKERS,
        "jobs": JOBS,
        "mix": {kind: MIX.count(kind) for kind in dict.fromkeys(MIX)},
        "floor": floor,
        "floor_postgres": floor_postgres,
    }
    for name, figures in (("sqlite", sqlite), ("postgres", postgres)):
        out[name] = {
            **figures,
            "read_vs_floor": round(figures["read"]["per_s"] / floor["read"]["per_s"], 3),
            "mix_vs_floor": round(figures["mix"]["per_s"] / floor["read"]["per_s"], 3),
        }
    same_db = floor_postgres["read"]["per_s"]
    out["postgres"]["read_vs_postgres_floor"] = round(postgres["read"]["per_s"] / same_db, 3)
    out["postgres"]["mix_vs_postgres_floor"] = round(postgres["mix"]["per_s"] / same_db, 3)
    return out


# --- the load generator ----------------------------------------------------------------------


def _wrk() -> str:
    """wrk from Debian, installed here when missing (the bench runs as root, as `make bench`)."""
    found = shutil.which("wrk")
    if found:
        return found
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "wrk"]):
        done = subprocess.run(
            argv,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"could not install wrk ({' '.join(argv)}): {done.stderr[-500:]}")
    return shutil.which("wrk") or "/usr/bin/wrk"


def _load(wrk: str, url: str, script: Path, seconds: int) -> dict:
    done = subprocess.run(
        [wrk, "-t", str(min(4, os.cpu_count() or 1)), "-c", str(CONNECTIONS)]
        + ["-d", f"{seconds}s", "--timeout", "10s", "-s", str(script), url],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"wrk failed: {done.stdout[-1000:]}{done.stderr[-1000:]}")
    raw = json.loads(lines[-1])
    errors = sum(raw[k] for k in ("connect", "read", "write", "status", "timeout"))
    return {
        "requests": raw["requests"],
        "per_s": round(raw["requests"] / (raw["duration_us"] / 1e6), 1),
        "p50_ms": round(raw["p50_us"] / 1000, 1),
        "p99_ms": round(raw["p99_us"] / 1000, 1),
        "max_ms": round(raw["max_us"] / 1000, 1),
        "errors": errors,
        "error_kinds": {k: raw[k] for k in ("connect", "read", "write", "status", "timeout")},
    }


def _measure(wrk: str, url: str, script: Path, servers: _started) -> dict:
    """The load's figures, and the CPU each server process spent per request meanwhile."""
    _load(wrk, url, script, WARM_UP_S)  # every worker imported and connected
    before = servers.cpu_seconds()
    figures = _load(wrk, url, script, DURATION_S)
    spent = servers.cpu_seconds()
    figures["cpu_ms_per_request"] = {
        role: round((spent[role] - before.get(role, 0.0)) * 1000 / max(1, figures["requests"]), 2)
        for role in spent
    }
    return figures


def _script(path: Path, body: str) -> Path:
    path.write_text(body + REPORT)
    return path


def _starforge_scripts(work: Path, seeded: dict) -> tuple[Path, Path]:
    ids = ", ".join(str(i) for i in seeded["job_ids"][:500])
    head = f"""
local ids = {{{ids}}}
local headers = {{["Authorization"] = "Bearer {seeded["token"]}",
                  ["Content-Type"] = "application/json"}}
local body = '{json.dumps(seeded["submit"])}'
local n = 0
"""
    read = _script(
        work / "read.lua",
        head
        + """
request = function()
  n = n + 1
  return wrk.format("GET", "/api/v1/jobs/" .. ids[n % #ids + 1], headers)
end
""",
    )
    plan = ", ".join(f'"{kind}"' for kind in MIX)
    mix = _script(
        work / "mix.lua",
        head
        + f"""
local plan = {{{plan}}}
request = function()
  n = n + 1
  local id = ids[n % #ids + 1]
  local kind = plan[n % #plan + 1]
  if kind == "list" then return wrk.format("GET", "/api/v1/jobs?limit=50", headers) end
  if kind == "read" then return wrk.format("GET", "/api/v1/jobs/" .. id, headers) end
  if kind == "events" then return wrk.format("GET", "/api/v1/jobs/" .. id .. "/events", headers) end
  if kind == "usage" then return wrk.format("GET", "/api/v1/usage?by=user", headers) end
  return wrk.format("POST", "/api/v1/jobs", headers, body)
end
""",
    )
    return read, mix


# --- the floor -------------------------------------------------------------------------------


def _floor(work: Path, wrk: str, workers: int, *, postgres: bool = False) -> dict:
    work.mkdir()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "floor.settings", "PYTHONUNBUFFERED": "1"}
    python = [sys.executable]
    subprocess.run([*python, "-m", "django", "startproject", "floor", str(work)], check=True)
    with open(work / "floor" / "settings.py", "a") as settings:
        settings.write('\nDEBUG = False\nALLOWED_HOSTS = ["127.0.0.1"]\n')
        if postgres:
            common.create_db(FLOOR_DB)
            database = {"ENGINE": "django.db.backends.postgresql", "NAME": FLOOR_DB}
            database.update(HOST="127.0.0.1", PORT=5432, USER="postgres", CONN_MAX_AGE=600)
            settings.write(f"DATABASES = {{'default': {database!r}}}\n")
    (work / "floor" / "urls.py").write_text(FLOOR_URLS)
    manage = [*python, "manage.py"]
    try:
        subprocess.run([*manage, "migrate", "-v", "0"], cwd=work, env=env, check=True)
        create = "from django.contrib.auth.models import User; User.objects.create(username='x')"
        subprocess.run([*manage, "shell", "-v", "0", "-c", create], cwd=work, env=env, check=True)
        port = common.free_port()
        argv = [*python, "-m", "gunicorn", "floor.wsgi:application"]
        argv += ["--bind", f"127.0.0.1:{port}", "--workers", str(workers)]
        argv += ["--worker-class", "sync", "--log-level", "warning"]
        with _started({"floor": (argv, env, work)}, work, port) as servers:
            url = f"http://127.0.0.1:{port}/read/1"
            _expect(url, {}, 200)
            script = _script(work / "read.lua", 'request = function() return wrk.format("GET") end')
            return {"read": _measure(wrk, url, script, servers)}
    finally:
        if postgres:
            common.drop_db(FLOOR_DB)


# --- Starforge -------------------------------------------------------------------------------


def _embedded(work: Path, wrk: str) -> dict:
    """`manage.py runstack` on the embedded SQLite ledger under `work`, as `make run`."""
    (work / "var").mkdir(parents=True)
    env = {
        **os.environ,
        "SF_VAR_DIR": str(work / "var"),
        "DJANGO_SETTINGS_MODULE": "starforge.settings",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("DATABASE_URL", None)
    seeding = subprocess.run(
        [sys.executable, __file__, "--seed"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if seeding.returncode != 0:
        raise RuntimeError(f"seeding the SQLite ledger failed:\n{seeding.stderr[-2000:]}")
    seeded = json.loads(seeding.stdout.strip().splitlines()[-1])
    port, ws_port = common.free_port(), common.free_port()
    env.update(SF_PORT=str(port), SF_WS_PORT=str(ws_port))
    runstack = [sys.executable, "manage.py", "runstack"]
    with _started({"runstack": (runstack, env, ROOT)}, work, port, ws_port) as servers:
        return _starforge(work, wrk, port, seeded, servers)


def _production(work: Path, wrk: str, workers: int) -> dict:
    """The production recipe on this child's PostgreSQL database."""
    from starforge.serving import web_server_argv, websocket_server_argv

    work.mkdir()
    seeded = seed()
    port, ws_port = common.free_port(), common.free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "starforge.settings_prod",
        "SF_SECRET_KEY": secrets.token_urlsafe(64),
        "SF_ALLOWED_HOSTS": "127.0.0.1",
        "SF_SSL_REDIRECT": "0",  # the TLS proxy in front redirects plain HTTP
        # `make bench`'s private Redis, without a password: no job runs beside the benchmark.
        "SF_REDIS_TRUSTED_NETWORK": "1",
        "SF_VAR_DIR": os.environ["SF_VAR_DIR"],
        "PYTHONUNBUFFERED": "1",
    }
    celery = [sys.executable, "-m", "celery", "-A", "starforge"]
    beat_schedule = str(work / "celerybeat-schedule")
    processes = {
        "web": (web_server_argv("127.0.0.1", port, workers), env, ROOT),
        "websocket": (websocket_server_argv("127.0.0.1", ws_port), env, ROOT),
        "worker": ([*celery, "worker", "--concurrency", "2", "--loglevel", "WARNING"], env, ROOT),
        "beat": (
            [*celery, "beat", "--schedule", beat_schedule, "--loglevel", "WARNING"],
            env,
            ROOT,
        ),
    }
    with _started(processes, work, port, ws_port) as servers:
        return _starforge(work, wrk, port, seeded, servers)


def _starforge(work: Path, wrk: str, port: int, seeded: dict, servers: _started) -> dict:
    base = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {seeded['token']}"}
    job = seeded["job_ids"][0]
    for path in (f"/api/v1/jobs/{job}", "/api/v1/jobs?limit=50", f"/api/v1/jobs/{job}/events"):
        _expect(base + path, headers, 200)
    _expect(base + "/api/v1/usage?by=user", headers, 200)
    _expect(base + "/api/v1/jobs", headers, 201, seeded["submit"])
    read, mix = _starforge_scripts(work, seeded)
    return {
        "read": _measure(wrk, base, read, servers),
        "mix": _measure(wrk, base, mix, servers),
    }


def seed() -> dict:
    """JOBS queued jobs of one team on a noop cluster, half admitted and launched (PENDING, with
    their events); the API token, the job ids and a submit body for the load."""
    from jobs.actions.tokens import issue_token
    from jobs.loops.launcher import launch_attempts
    from jobs.loops.scheduler import admit_queued_jobs
    from jobs.models import Job

    user = common.make_user()
    cluster = common.make_cluster(gpus=100_000)
    (team,) = common.make_teams(1, JOBS // 2, cluster, user)
    common.queue_jobs(JOBS, [team], cluster, user, prefix="h")
    admitted = admit_queued_jobs().admitted
    for i in range(0, len(admitted), 200):
        launch_attempts(admitted[i : i + 200])
    common.analyze()
    return {
        "token": issue_token(user, name="bench"),
        "job_ids": list(Job.objects.order_by("pk").values_list("pk", flat=True)),
        "submit": {
            "entrypoint": ["true"],
            "gpus_per_node": 0,
            "cluster": cluster.name,
            "team": team.name,
        },
    }


# --- processes -------------------------------------------------------------------------------


class _started:
    """Start `processes` (name: (argv, env, cwd)), logs under `work`; wait for `ports`; stop
    them all on the way out."""

    def __init__(self, processes: dict[str, tuple[list[str], dict, Path]], work: Path, *ports: int):
        self.processes, self.work, self.ports = processes, work, ports
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> _started:
        for name, (argv, env, cwd) in self.processes.items():
            with open(self.work / f"{name}.log", "wb") as log:
                self.procs.append(
                    subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
                )
        try:
            for port in self.ports:
                common.wait_for_port(port, 120, alive=self._alive)
        except BaseException as exc:
            self.__exit__()
            raise RuntimeError(f"{exc}; output:\n{self._logs()}") from exc
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time (user + system) so far of every process started here and its children, by
        role: web, websocket, worker, beat, redis (the floor's gunicorn is web too)."""
        spent: dict[str, float] = {}
        for proc in self.procs:
            try:
                tree = [psutil.Process(proc.pid)]
                tree += tree[0].children(recursive=True)
            except psutil.NoSuchProcess:
                continue
            for process in tree:
                try:
                    role = _role(process.cmdline())
                    times = process.cpu_times()
                except psutil.NoSuchProcess:
                    continue
                if role:
                    spent[role] = spent.get(role, 0.0) + times.user + times.system
        return spent

    def _alive(self) -> bool:
        return all(proc.poll() is None for proc in self.procs)

    def _logs(self) -> str:
        return "\n".join(
            f"--- {log.name}\n{log.read_text(errors='replace')[-1500:]}"
            for log in sorted(self.work.glob("*.log"))
        )


def _role(argv: list[str]) -> str:
    line = " ".join(argv)
    for needle, role in (
        ("gunicorn", "web"),
        ("granian", "web"),
        ("uvicorn", "websocket"),
        ("worker", "worker"),
        ("beat", "beat"),
        ("redis-server", "redis"),
    ):
        if needle in line:
            return role
    return ""


def _expect(url: str, headers: dict, status: int, body: dict | None = None) -> None:
    """One request outside the clock; any other answer stops the benchmark."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, headers={**headers, "Content-Type": "application/json"}
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                if answer.status != status:
                    raise RuntimeError(f"{url}: HTTP {answer.status}, expected {status}")
                return
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"{url}: HTTP {exc.code} {exc.read()[:300]!r}") from exc
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _seed_here() -> None:
    """`--seed`: migrate and seed the ledger this process's environment names; print JSON."""
    import django
    from django.core.management import call_command

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "starforge.settings")
    django.setup()
    call_command("migrate", verbosity=0)
    print(json.dumps(seed()))


if __name__ == "__main__" and sys.argv[1:] == ["--seed"]:
    _seed_here()
