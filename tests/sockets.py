"""Websockets in tests: a client for the real ASGI application, a page's socket as a signed-in
user, the close code a refused socket gets, and the first answer to a handshake."""

import json

from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator
from django.test import Client

from starforge.asgi import application


class WebsocketCommunicator(ApplicationCommunicator):
    """A websocket client for an ASGI app (channels.testing's own imports daphne, not installed)."""

    def __init__(self, app, path: str, headers: list[tuple[bytes, bytes]]) -> None:
        scope = {"type": "websocket", "path": path, "headers": headers, "subprotocols": []}
        super().__init__(app, scope)

    async def connect(self, timeout: float = 5) -> tuple[bool, int | None]:
        await self.send_input({"type": "websocket.connect"})
        answer = await self.receive_output(timeout)
        return answer["type"] == "websocket.accept", answer.get("code")

    async def receive_json_from(self, timeout: float = 5) -> dict:
        answer = await self.receive_output(timeout)
        assert answer["type"] == "websocket.send", answer
        return json.loads(answer["text"])

    async def disconnect(self, code: int = 1000, timeout: float = 5) -> None:
        await self.send_input({"type": "websocket.disconnect", "code": code})
        await self.wait(timeout)


def run(scenario, *args):
    return async_to_sync(scenario)(*args)


def signed_in(user, **kwargs) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


def session_of(user) -> str:
    return signed_in(user).cookies["sessionid"].value


def socket(path: str, session: str = "", app=application) -> WebsocketCommunicator:
    """A page's websocket, signed in when `session` (from `session_of`) is given."""
    headers = [(b"origin", b"http://testserver"), (b"host", b"testserver")]
    if session:
        headers.append((b"cookie", f"sessionid={session}".encode()))
    return WebsocketCommunicator(app, path, headers=headers)


async def close_code(communicator: WebsocketCommunicator) -> int | None:
    connected, _ = await communicator.connect()
    assert connected  # accepted, so that the browser sees the close code
    output = await communicator.receive_output()
    assert output["type"] == "websocket.close"
    return output["code"]


def handshake(
    origin: str | None,
    host: str = "testserver",
    scheme: str = "ws",
    session: str = "",
    path: str = "/ws/jobs/",
    extra: list[tuple[bytes, bytes]] | None = None,
) -> dict:
    """What the server answers first to this handshake: websocket.accept, or .close (refused)."""
    headers = [(b"host", host.encode()), *(extra or [])]
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    if session:
        headers.append((b"cookie", f"sessionid={session}".encode()))

    async def scenario() -> dict:
        communicator = WebsocketCommunicator(application, path, headers)
        communicator.scope["scheme"] = scheme
        await communicator.send_input({"type": "websocket.connect"})
        answer = await communicator.receive_output(5)
        await communicator.disconnect()
        return answer

    return async_to_sync(scenario)()


def accepted(answer: dict) -> bool:
    return answer["type"] == "websocket.accept"
