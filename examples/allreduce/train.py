"""A two-node all-reduce over TCP, standard library only: every rank contributes a value, rank 0
sums them and sends the sum back, and every rank prints it.

Starforge starts every rank of a multi-node job with the rank contract (`sf.contract.rank_env`):
NODE_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, the names torchrun reads, and their SF_*
twins. Rank 0 listens at MASTER_ADDR:MASTER_PORT; every other rank connects there, sends its
value and waits for the sum. Run by hand, without the contract, it is rank 0 of a world of one.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

CONTRACT = (
    "NODE_RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SF_NODE_ADDRS",
    "SF_GPUS_PER_NODE",
)


def contract() -> dict[str, str]:
    """The rank contract this process got (a world of one on 127.0.0.1 when run by hand)."""
    given = {name: os.environ[name] for name in CONTRACT if name in os.environ}
    return {"NODE_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", **given}


def value_of(rank: int) -> int:
    """What rank `rank` contributes: rank + 1, so the sum over a world of n is n(n+1)/2."""
    return rank + 1


def reduce_at_rank_0(addr: str, port: int, world: int, timeout: float) -> int:
    """Rank 0: accept every other rank, sum their values and its own, send each the sum."""
    total, peers = value_of(0), []
    with socket.create_server((addr, port)) as server:
        server.settimeout(timeout)
        while len(peers) < world - 1:
            conn, _ = server.accept()
            conn.settimeout(timeout)
            stream = conn.makefile("rwb")
            message = json.loads(stream.readline())
            print(f"rank 0 got {message['value']} from rank {message['rank']}", flush=True)
            total += message["value"]
            peers.append((conn, stream))
        for conn, stream in peers:
            stream.write(json.dumps({"sum": total}).encode() + b"\n")
            stream.flush()
            stream.close()
            conn.close()
    return total


def reduce_at_peer(rank: int, addr: str, port: int, timeout: float) -> int:
    """Any other rank: connect to rank 0 (which may start later), send the value, read the sum."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=timeout)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    with conn, conn.makefile("rwb") as stream:
        stream.write(json.dumps({"rank": rank, "value": value_of(rank)}).encode() + b"\n")
        stream.flush()
        return json.loads(stream.readline())["sum"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for peers")
    args = parser.parse_args(argv)
    env = contract()
    rank, world = int(env["NODE_RANK"]), int(env["WORLD_SIZE"])
    print("contract " + " ".join(f"{k}={v}" for k, v in sorted(env.items())), flush=True)
    if rank == 0 and world == 1:
        total = value_of(0)
    elif rank == 0:
        total = reduce_at_rank_0(env["MASTER_ADDR"], int(env["MASTER_PORT"]), world, args.timeout)
    else:
        total = reduce_at_peer(rank, env["MASTER_ADDR"], int(env["MASTER_PORT"]), args.timeout)
    expected = world * (world + 1) // 2
    print(f"rank {rank} of {world}: all-reduce sum {total} (expected {expected})", flush=True)
    return 0 if total == expected else 1


if __name__ == "__main__":
    sys.exit(main())
