"""Handlers the tests run: ones that succeed, raise, sleep and crash."""

import os
import time

from queue_app.handlers import registry


def echo(payload):
    return payload


def add(payload):
    return payload["a"] + payload["b"]


class Boom(Exception):
    pass


def boom(payload):
    raise Boom(payload.get("message", "boom"))


def sleepy(payload):
    time.sleep(payload.get("seconds", 0.1))
    return "slept"


def crash(payload):
    os._exit(payload.get("code", 13))


def unserializable(payload):
    return object()


async def async_echo(payload):
    return payload


def with_job(payload, job):
    return {"id": job.id, "attempt": job.attempts}


ALL = {
    "echo": echo,
    "add": add,
    "boom": boom,
    "sleepy": sleepy,
    "crash": crash,
    "unserializable": unserializable,
    "async_echo": async_echo,
    "with_job": with_job,
}


def register_all():
    for kind, func in ALL.items():
        registry.register(kind, func)
