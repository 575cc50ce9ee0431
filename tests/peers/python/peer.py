"""A py-eureka-client test peer the Rust tests drive.

It registers, heartbeats and fetches (full first, then deltas) every --interval seconds, and
prints one JSON line per interval describing what the client sees:

  {"event": "tick", "full": 1, "delta": 7, "seen": {"APP": [["id", "UP"], ...]}}

`full` counts GET apps/ (a full fetch after the first means a hash-code mismatch), `delta`
counts GET apps/delta. On SIGTERM it stops the client (DOWN, then DELETE) and prints
{"event": "stopped"}.

py-eureka-client heartbeats from a thread with its own event loop that `stop()` cannot end
(`threading.Timer.cancel` does nothing once the timer has fired). A heartbeat that lands while
`stop()` re-registers DOWN carries the new lastDirtyTimestamp before the register has; the server
answers 404 (as Java's does), that thread registers too, and the two threads then race on the
client's URL cache ("dictionary changed size during iteration") and its HTTP client, and the
process can hang. A real service has the same race; the peer closes it so that the tests see
what the server does, not that race: heartbeats stop, and the one in flight finishes, before
`stop()` runs.
"""
import argparse
import asyncio
import json
import signal
import sys
import threading

import py_eureka_client.eureka_client as ec

COUNTS = {"full": 0, "delta": 0}


def counting(name, fn):
    async def wrapper(*args, **kwargs):
        result = await fn(*args, **kwargs)
        COUNTS[name] += 1
        return result
    return wrapper


# EurekaClient calls these module-level functions for its fetches.
ec.get_applications = counting("full", ec.get_applications)
ec.get_delta = counting("delta", ec.get_delta)


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def seen(client):
    out = {}
    apps = client.applications
    if apps is None:
        return out
    for app in apps.applications:
        out[app.name] = sorted([i.instanceId, i.status] for i in app.instances)
    return out


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--server", required=True, help="e.g. http://127.0.0.1:8761/eureka")
    p.add_argument("--app", required=True)
    p.add_argument("--id", required=True)
    p.add_argument("--port", type=int, default=9090)
    p.add_argument("--interval", type=int, default=1)
    p.add_argument("--vip", default="")
    args = p.parse_args()

    client = ec.EurekaClient(
        eureka_server=args.server, app_name=args.app, instance_id=args.id,
        instance_host="127.0.0.1", instance_ip="127.0.0.1", instance_port=args.port,
        vip_adr=args.vip or args.app.lower(), secure_vip_addr=args.vip or args.app.lower(),
        renewal_interval_in_secs=args.interval, duration_in_secs=args.interval * 3,
        metadata={"lang": "python"})
    # See the module docs: no heartbeat runs once `quiet` is set.
    beat = client._EurekaClient__heartbeat
    beating = threading.Lock()
    quiet = threading.Event()

    async def guarded_beat():
        with beating:
            if not quiet.is_set():
                await beat()

    client._EurekaClient__heartbeat = guarded_beat
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await client.start()
    emit({"event": "started"})
    while not stop.is_set():
        emit({"event": "tick", "full": COUNTS["full"], "delta": COUNTS["delta"], "seen": seen(client)})
        try:
            await asyncio.wait_for(stop.wait(), timeout=args.interval)
        except asyncio.TimeoutError:
            pass
    quiet.set()
    await loop.run_in_executor(None, lambda: (beating.acquire(), beating.release()))
    await client.stop()
    emit({"event": "stopped"})


asyncio.run(main())
