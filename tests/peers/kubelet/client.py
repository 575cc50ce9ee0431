"""A py-eureka-client application for the real-node tests, run in a pod from an image of its own.

It registers itself (app --app, the pod's IP), fetches the registry through --server (the
chart's client Service), and every second calls each UP instance of --call by the address the
registry gives (py-eureka-client's do_service, prefer_ip), printing one JSON line per call:

  {"event": "call", "app": "HELLO", "ok": true, "body": {"pod": ..., "ip": ...}}
  {"event": "call", "app": "HELLO", "ok": false, "error": "..."}

and one line per second with what its registry copy holds of --call:

  {"event": "seen", "app": "HELLO", "instances": [["id", "UP", "10.244.1.7", 8080], ...]}

The tests read these lines from the pod's log. Basic auth goes in --server's URL; a private CA
through SSL_CERT_FILE (httpx reads it).
"""
import argparse
import asyncio
import json
import os
import signal
import sys

import py_eureka_client.eureka_client as ec


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def seen(client, app_name):
    apps = client.applications
    app = apps.get_application(app_name) if apps else None
    if app is None:
        return []
    return sorted([i.instanceId, i.status, i.ipAddr, i.port.port] for i in app.instances)


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--server", required=True, help="defaultZone, e.g. http://eo-eureka-operator.eureka-system.svc:8761/eureka")
    p.add_argument("--app", default="POD-CLIENT")
    p.add_argument("--call", required=True, help="the application to call")
    p.add_argument("--interval", type=int, default=1)
    args = p.parse_args()

    ip = os.environ.get("POD_IP", "127.0.0.1")
    client = ec.EurekaClient(
        eureka_server=args.server, app_name=args.app,
        instance_id=os.environ.get("POD_NAME", args.app.lower()),
        instance_host=ip, instance_ip=ip, instance_port=8080,
        renewal_interval_in_secs=args.interval, duration_in_secs=args.interval * 10,
        metadata={"lang": "python"})
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await client.start()
    emit({"event": "started"})
    while not stop.is_set():
        emit({"event": "seen", "app": args.call, "instances": seen(client, args.call)})
        try:
            body = await client.do_service(args.call, "/", return_type="json", prefer_ip=True, timeout=2)
            emit({"event": "call", "app": args.call, "ok": True, "body": body})
        except Exception as e:  # every failure is a line the test reads
            emit({"event": "call", "app": args.call, "ok": False, "error": f"{type(e).__name__}: {e}"})
        try:
            await asyncio.wait_for(stop.wait(), timeout=args.interval)
        except asyncio.TimeoutError:
            pass
    await client.stop()
    emit({"event": "stopped"})


asyncio.run(main())
