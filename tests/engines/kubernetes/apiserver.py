"""A small in-process Kubernetes API server: the REST subset the Kubernetes executor uses.

Why not kmock (PyPI, evaluated first at 0.8, the current release): it falls short here.
1. Its pytest plugin is an auto-loaded entry point that imports `pytest_asyncio`, which kmock
   does not depend on: installing kmock into the project's environment broke test collection
   for the whole suite, not only for these tests.
2. Its list ignores `labelSelector`: every object of the kind comes back, so the executor's
   one labelled list per tick could not be tested against it.
3. Objects get no uid, namespace or creationTimestamp; 404/409 bodies carry made-up reasons
   ("Object Already Exists") and a Python traceback instead of NotFound/AlreadyExists with the
   real `details`; nothing is validated (no 422), and deleting a Job leaves its pods.

This server speaks JSON over HTTP in a thread, through the real `kubernetes` client:
  batch/v1 jobs   create, get, list (namespaced or all), delete with DeleteOptions
  v1 pods         create, get, list (namespaced or all), delete
  v1 services     create, get, list (namespaced or all), delete
  v1 nodes        get, list
  /version
Lists take `labelSelector` (`k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a,b)`,
comma-joined: all must hold) and `fieldSelector` (`=`, `==`, `!=` on the fields the real server
allows for the kind). Watches and patches are refused with 405.

Copied from the real server: a bearer token is required (401 without); object names and labels
are validated (422 Invalid with the real message shape); creation fills uid, namespace,
resourceVersion and creationTimestamp and ignores a posted pod's status; a Job gets its selector
and its template the controller-uid and job-name labels; deleting a batch/v1 Job orphans its
pods unless the request says `propagationPolicy` Background or Foreground (the REST default for
Jobs is Orphan), which delete what it owns (its pods, a Service naming it as owner). A Job's
validation covers what the executor sends: completionMode, an Indexed Job's completions, a
podFailurePolicy (its actions, operators, container names, and restartPolicy Never), the pod's
subdomain and the downward API paths its env reads; a Service's name is a DNS-1035 label and
its selector valid labels. Not copied: graceful deletion (a deleted object vanishes at
once, so Foreground and Background look the same), resourceVersion semantics, defaulting
beyond the fields above.

Tests drive state through the thread-safe store API (`add`, `get`, `select`, `mutate`, `remove`):
it bypasses HTTP, so the request log (`requests`, `count`) holds only what clients sent.
`fail(method, path, code, reason, message)` makes the next such request answer an error Status.
"""

import copy
import datetime as dt
import json
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

TOKEN = "emulator-token"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# The pod fields the downward API serves to env (fieldRef.fieldPath), as the real server checks.
FIELD_PATHS = re.compile(
    r"^(metadata\.(name|namespace|uid)|metadata\.(labels|annotations)\['[^']+'\]"
    r"|spec\.(nodeName|serviceAccountName)|status\.(hostIP|hostIPs|podIP|podIPs))$"
)
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<namespace>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?$"
)


@dataclass(frozen=True)
class Kind:
    plural: str
    kind: str
    group: str
    namespaced: bool
    fields: tuple[str, ...]  # what a fieldSelector may name

    @property
    def api_version(self) -> str:
        return f"{self.group}/v1" if self.group else "v1"

    def qualified(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


KINDS = {
    k.plural: k
    for k in (
        Kind("jobs", "Job", "batch", True, ("metadata.name", "metadata.namespace")),
        Kind(
            "pods",
            "Pod",
            "",
            True,
            ("metadata.name", "metadata.namespace", "spec.nodeName", "status.phase"),
        ),
        Kind("services", "Service", "", True, ("metadata.name", "metadata.namespace")),
        Kind("nodes", "Node", "", False, ("metadata.name", "spec.unschedulable")),
    )
}


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, str]


class ApiError(Exception):
    """Becomes a `Status` response, shaped as the real API server writes them."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def body(self) -> dict:
        status = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            status["details"] = self.details
        return status


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeApiServer:
    """The emulator: `start()` it, point a kubeconfig at it, `close()` it (or use `with`)."""

    def __init__(self) -> None:
        self._objects: dict[tuple[str, str, str], dict] = {}
        self._lock = threading.RLock()
        self._version = 0
        self.requests: list[Request] = []
        self._faults: list[tuple[str, str, ApiError]] = []
        self._http: ThreadingHTTPServer | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "FakeApiServer":
        handler = type("Handler", (_Handler,), {"api": self})
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._http.daemon_threads = True
        serve = threading.Thread(target=self._http.serve_forever, args=(0.02,), daemon=True)
        serve.start()
        return self

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None

    def __enter__(self) -> "FakeApiServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def url(self) -> str:
        assert self._http is not None, "start() the emulator first"
        host, port = self._http.server_address[:2]
        return f"http://{host!s}:{port}"

    def write_kubeconfig(self, path: Path, context: str = "emulator") -> Path:
        """A kubeconfig (JSON is YAML) whose `context` reaches this server with its token."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": TOKEN}}],
            "contexts": [{"name": context, "context": {"cluster": "emulator", "user": "tester"}}],
            "current-context": context,
        }
        path.write_text(json.dumps(config))
        return path

    # -- store API for tests and the fake kubelet --------------------------------------------
    def add(self, plural: str, obj: dict, namespace: str = "default") -> dict:
        """Store an object as given (status included), filling the metadata a server fills."""
        with self._lock:
            return copy.deepcopy(self._create(KINDS[plural], copy.deepcopy(obj), namespace))

    def get(self, plural: str, name: str, namespace: str = "default") -> dict | None:
        with self._lock:
            obj = self._objects.get(self._key(KINDS[plural], namespace, name))
            return copy.deepcopy(obj) if obj else None

    def select(self, plural: str, namespace: str | None = None, selector: str = "") -> list[dict]:
        with self._lock:
            return copy.deepcopy(self._select(KINDS[plural], namespace, selector, ""))

    def mutate(
        self, plural: str, name: str, change: Callable[[dict], None], namespace: str = "default"
    ) -> dict | None:
        """Apply `change` to the stored object in place; None if it does not exist."""
        with self._lock:
            obj = self._objects.get(self._key(KINDS[plural], namespace, name))
            if obj is None:
                return None
            change(obj)
            obj["metadata"]["resourceVersion"] = self._next_version()
            return copy.deepcopy(obj)

    def remove(self, plural: str, name: str, namespace: str = "default") -> None:
        with self._lock:
            self._objects.pop(self._key(KINDS[plural], namespace, name), None)

    def fail(self, method: str, path: str, code: int, reason: str, message: str) -> None:
        """Answer the next `method` request to exactly `path` with this error Status, once."""
        with self._lock:
            self._faults.append((method, path, ApiError(code, reason, message)))

    def count(self, method: str, path: str) -> int:
        """How many requests clients sent with this method to this exact path."""
        with self._lock:
            return sum(1 for r in self.requests if r.method == method and r.path == path)

    # -- the REST semantics ------------------------------------------------------------------
    def handle(self, method: str, url: str, token: str, body: bytes) -> tuple[int, dict]:
        split = urlsplit(url)
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        with self._lock:
            self.requests.append(Request(method, split.path, query))
        try:
            if token != TOKEN:
                raise ApiError(401, "Unauthorized", "Unauthorized")
            if split.path == "/version":
                return 200, {"major": "1", "minor": "31", "gitVersion": "v1.31.0-emulator"}
            kind, namespace, name = _route(split.path)
            with self._lock:
                for fault in self._faults:
                    if fault[:2] == (method, split.path):
                        self._faults.remove(fault)
                        raise fault[2]
                return self._dispatch(method, kind, namespace, name, query, body)
        except ApiError as exc:
            return exc.code, exc.body()

    def _dispatch(
        self, method: str, kind: Kind, namespace: str | None, name: str | None, query, body
    ) -> tuple[int, dict]:
        if query.get("watch") in ("true", "1"):
            raise ApiError(405, "MethodNotAllowed", "watch is not served by this emulator")
        if method == "GET" and name is None:
            items = self._select(
                kind, namespace, query.get("labelSelector", ""), query.get("fieldSelector", "")
            )
            return 200, {
                "kind": f"{kind.kind}List",
                "apiVersion": kind.api_version,
                "metadata": {"resourceVersion": str(self._version)},
                "items": [_as_item(o) for o in items],
            }
        if method == "GET":
            return 200, self._existing(kind, namespace, name)
        if method == "POST" and name is None:
            return 201, self._create_from_request(kind, namespace, body)
        if method == "DELETE" and name is not None:
            return 200, self._delete(kind, namespace, name, query, body)
        raise ApiError(405, "MethodNotAllowed", f"{method} is not served by this emulator")

    def _create_from_request(self, kind: Kind, namespace: str | None, body: bytes) -> dict:
        try:
            obj = json.loads(body or b"{}")
        except ValueError as exc:
            raise ApiError(
                400, "BadRequest", f"the body of the request was invalid: {exc}"
            ) from exc
        given = obj.get("metadata", {}).get("namespace")
        if given and namespace and given != namespace:
            raise ApiError(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on "
                "the request",
            )
        if kind.plural == "pods":
            obj.pop("status", None)  # a client cannot post a pod's status
        return self._create(kind, obj, namespace or "default")

    def _create(self, kind: Kind, obj: dict, namespace: str) -> dict:
        meta = obj.setdefault("metadata", {})
        name = meta.get("name", "")
        _validate(kind, obj)
        key = self._key(kind, namespace, name)
        if key in self._objects:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{kind.qualified()} "{name}" already exists',
                _details(kind, name),
            )
        obj.update(kind=kind.kind, apiVersion=kind.api_version)
        meta.update(
            uid=str(uuid.uuid4()),
            resourceVersion=self._next_version(),
            creationTimestamp=now_rfc3339(),
        )
        if kind.namespaced:
            meta["namespace"] = namespace
        if kind.plural == "jobs":
            _default_job(obj)
        obj.setdefault("status", {"phase": "Pending"} if kind.plural == "pods" else {})
        self._objects[key] = obj
        return obj

    def _delete(
        self, kind: Kind, namespace: str | None, name: str, query: dict, body: bytes
    ) -> dict:
        obj = self._existing(kind, namespace, name)
        options = json.loads(body) if body else {}
        policy = options.get("propagationPolicy") or query.get("propagationPolicy")
        if policy is None:  # the REST default: batch/v1 Jobs orphan their pods
            policy = "Orphan" if kind.plural == "jobs" else "Background"
        del self._objects[self._key(kind, namespace or "", name)]
        uid = obj["metadata"]["uid"]
        for key, dependent in list(self._objects.items()):
            owners = dependent["metadata"].get("ownerReferences", [])
            if not any(o.get("uid") == uid for o in owners):
                continue
            if policy == "Orphan":
                dependent["metadata"]["ownerReferences"] = [o for o in owners if o["uid"] != uid]
            else:
                del self._objects[key]
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {**_details(kind, name), "uid": uid},
        }

    def _existing(self, kind: Kind, namespace: str | None, name: str | None) -> dict:
        obj = self._objects.get(self._key(kind, namespace or "", name or ""))
        if obj is None:
            raise ApiError(
                404, "NotFound", f'{kind.qualified()} "{name}" not found', _details(kind, name)
            )
        return obj

    def _select(self, kind: Kind, namespace: str | None, labels: str, fields: str) -> list[dict]:
        label_ok = parse_label_selector(labels)
        field_ok = parse_field_selector(kind, fields)
        return [
            obj
            for (plural, ns, _), obj in sorted(self._objects.items())
            if plural == kind.plural
            and (namespace is None or ns == namespace)
            and label_ok(obj["metadata"].get("labels") or {})
            and field_ok(obj)
        ]

    def _key(self, kind: Kind, namespace: str, name: str) -> tuple[str, str, str]:
        return (kind.plural, namespace if kind.namespaced else "", name)

    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)


class _Handler(BaseHTTPRequestHandler):
    api: FakeApiServer

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        auth = self.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ").strip()
        code, payload = self.api.handle(self.command, self.path, token, body)
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _serve

    def log_message(self, format: str, *args: object) -> None:
        return None  # quiet: the request log is `FakeApiServer.requests`


def _route(path: str) -> tuple[Kind, str | None, str | None]:
    match = PATH.match(path)
    kind = KINDS.get(match["plural"]) if match else None
    if not match or kind is None or (match["group"] or "") != kind.group:
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    if match["namespace"] and not kind.namespaced:
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    return kind, match["namespace"], match["name"]


def _details(kind: Kind, name: str | None) -> dict:
    details = {"name": name or "", "kind": kind.plural}
    if kind.group:
        details["group"] = kind.group
    return details


def _as_item(obj: dict) -> dict:
    """List items carry no kind/apiVersion on the real server either."""
    return {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}


def _default_job(job: dict) -> None:
    """What the real server adds to a Job on create (manualSelector unset)."""
    meta, spec = job["metadata"], job.setdefault("spec", {})
    uid, name = meta["uid"], meta["name"]
    spec.setdefault("parallelism", 1)
    spec.setdefault("completions", 1)
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    template_meta = spec.setdefault("template", {}).setdefault("metadata", {})
    template_meta.setdefault("labels", {}).update(
        {
            "batch.kubernetes.io/controller-uid": uid,
            "batch.kubernetes.io/job-name": name,
            "controller-uid": uid,
            "job-name": name,
        }
    )


def _validate(kind: Kind, obj: dict) -> None:
    meta = obj["metadata"]
    name = meta.get("name", "")
    causes: list[tuple[str, str]] = []
    if not name:
        causes.append(("metadata.name", "Required value: name or generateName is required"))
    elif not DNS_LABEL.match(name) or len(name) > 63:
        causes.append(
            (
                "metadata.name",
                f'Invalid value: "{name}": a lowercase RFC 1123 label must consist of lower '
                "case alphanumeric characters or '-', and must start and end with an "
                "alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
                "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?') and be at most 63 characters",
            )
        )
    causes += _label_causes("metadata.labels", meta.get("labels") or {})
    if kind.plural == "jobs":
        causes += _job_causes(obj.get("spec") or {})
    if kind.plural == "services":
        causes += _service_causes(name, obj.get("spec") or {})
    if causes:
        text = ", ".join(f"{field}: {message}" for field, message in causes)
        raise ApiError(
            422,
            "Invalid",
            f'{kind.kind}{"." + kind.group if kind.group else ""} "{name}" is invalid: '
            + (text if len(causes) == 1 else f"[{text}]"),
            {
                **_details(kind, name),
                "kind": kind.kind,
                "causes": [
                    {"reason": "FieldValueInvalid", "message": m, "field": f} for f, m in causes
                ],
            },
        )


def _label_causes(field: str, labels: dict) -> list[tuple[str, str]]:
    causes = []
    for key, value in labels.items():
        name = str(key).rsplit("/", 1)[-1]
        if not LABEL_NAME.match(name) or len(name) > 63:
            causes.append((field, f'Invalid value: "{key}": name part must be a valid label'))
        if not isinstance(value, str) or not LABEL_VALUE.match(value) or len(value) > 63:
            causes.append(
                (
                    field,
                    f'Invalid value: "{value}": a valid label must be an empty string or consist '
                    "of alphanumeric characters, '-', '_' or '.', and must start and end with an "
                    "alphanumeric character, and be at most 63 characters",
                )
            )
    return causes


def _job_causes(spec: dict) -> list[tuple[str, str]]:
    template = spec.get("template") or {}
    pod = template.get("spec") or {}
    causes = _label_causes(
        "spec.template.metadata.labels", (template.get("metadata") or {}).get("labels") or {}
    )
    if pod.get("restartPolicy") not in ("Never", "OnFailure"):
        causes.append(
            (
                "spec.template.spec.restartPolicy",
                f'Unsupported value: "{pod.get("restartPolicy", "Always")}": supported values: '
                '"OnFailure", "Never"',
            )
        )
    containers = pod.get("containers") or []
    if not containers:
        causes.append(("spec.template.spec.containers", "Required value"))
    for i, container in enumerate(containers):
        if not container.get("image"):
            causes.append((f"spec.template.spec.containers[{i}].image", "Required value"))
        for j, env in enumerate(container.get("env") or []):
            path = ((env.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
            if path is not None and not FIELD_PATHS.match(path):
                causes.append(
                    (
                        f"spec.template.spec.containers[{i}].env[{j}].valueFrom.fieldRef.fieldPath",
                        f'Invalid value: "{path}": error converting fieldPath: field label not '
                        "supported",
                    )
                )
    subdomain = pod.get("subdomain")
    if subdomain is not None and not (DNS_LABEL.match(subdomain) and len(subdomain) <= 63):
        causes.append(
            (
                "spec.template.spec.subdomain",
                f'Invalid value: "{subdomain}": a lowercase RFC 1123 label',
            )
        )
    mode = spec.get("completionMode", "NonIndexed")
    if mode not in ("NonIndexed", "Indexed"):
        causes.append(
            (
                "spec.completionMode",
                f'Unsupported value: "{mode}": supported values: "NonIndexed", "Indexed"',
            )
        )
    if mode == "Indexed" and spec.get("completions") is None:
        causes.append(("spec.completions", "Required value: when completion mode is Indexed"))
    if spec.get("podFailurePolicy") is not None:
        causes += _pod_failure_policy_causes(spec["podFailurePolicy"], pod, containers)
    return causes


def _pod_failure_policy_causes(policy: dict, pod: dict, containers: list) -> list[tuple[str, str]]:
    causes = []
    if pod.get("restartPolicy") != "Never":
        causes.append(
            (
                "spec.template.spec.restartPolicy",
                f'Invalid value: "{pod.get("restartPolicy")}": only "Never" is supported when '
                "podFailurePolicy is specified",
            )
        )
    names = {c.get("name") for c in containers}
    for i, rule in enumerate(policy.get("rules") or []):
        field = f"spec.podFailurePolicy.rules[{i}]"
        if rule.get("action") not in ("Count", "FailIndex", "FailJob", "Ignore"):
            causes.append(
                (
                    f"{field}.action",
                    f'Unsupported value: "{rule.get("action")}": supported values: "Count", '
                    '"FailIndex", "FailJob", "Ignore"',
                )
            )
        codes = rule.get("onExitCodes")
        if codes is None:
            continue
        if codes.get("operator") not in ("In", "NotIn"):
            causes.append(
                (
                    f"{field}.onExitCodes.operator",
                    f'Unsupported value: "{codes.get("operator")}": supported values: "In", '
                    '"NotIn"',
                )
            )
        if not codes.get("values"):
            causes.append((f"{field}.onExitCodes.values", "Required value"))
        container = codes.get("containerName")
        if container is not None and container not in names:
            causes.append(
                (
                    f"{field}.onExitCodes.containerName",
                    f'Invalid value: "{container}": must be one of the container or initContainer '
                    "names in the pod template",
                )
            )
    return causes


def _service_causes(name: str, spec: dict) -> list[tuple[str, str]]:
    causes = []
    if name and not DNS_1035.match(name):
        causes.append(
            (
                "metadata.name",
                f'Invalid value: "{name}": a DNS-1035 label must consist of lower case '
                "alphanumeric characters or '-', start with an alphabetic character, and end "
                "with an alphanumeric character",
            )
        )
    causes += _label_causes("spec.selector", spec.get("selector") or {})
    return causes


# -- selectors ---------------------------------------------------------------------------------
_EXISTS = re.compile(r"^(!?)\s*([\w./-]+)$")
_EQUALS = re.compile(r"^([\w./-]+)\s*(==|=|!=)\s*([\w.-]*)$")
_SET = re.compile(r"^([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)$")


def parse_label_selector(text: str) -> Callable[[dict], bool]:
    """A predicate over an object's labels; 400 BadRequest for what the real server refuses."""
    tests = [_requirement(part.strip()) for part in _split(text) if part.strip()]
    return lambda labels: all(test(labels) for test in tests)


def _split(text: str) -> list[str]:
    """Split on commas outside parentheses (`a in (x,y),b=c`)."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return parts + [current]


def _requirement(part: str) -> Callable[[dict], bool]:
    if m := _SET.match(part):
        key, op, values = m[1], m[2], {v.strip() for v in m[3].split(",") if v.strip()}
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if m := _EQUALS.match(part):
        key, op, value = m[1], m[2], m[3]
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if m := _EXISTS.match(part):
        negate, key = m[1] == "!", m[2]
        return lambda labels: (key in labels) != negate
    raise ApiError(400, "BadRequest", f"unable to parse requirement: {part!r}")


def parse_field_selector(kind: Kind, text: str) -> Callable[[dict], bool]:
    tests = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        m = re.match(r"^([\w.]+)\s*(==|=|!=)\s*(.*)$", part)
        if not m:
            raise ApiError(400, "BadRequest", f"invalid selector: {part!r}")
        if m[1] not in kind.fields:
            raise ApiError(
                400, "BadRequest", f'field label not supported: "{m[1]}" for {kind.plural}'
            )
        tests.append((m[1].split("."), m[2] == "!=", m[3]))

    return lambda obj: all((_field(obj, path) == value) != negate for path, negate, value in tests)


def _field(obj: dict, path: list[str]) -> str:
    found: object = obj
    for step in path:
        found = found.get(step) if isinstance(found, dict) else None
    if isinstance(found, bool):
        return str(found).lower()
    return "" if found is None else str(found)
