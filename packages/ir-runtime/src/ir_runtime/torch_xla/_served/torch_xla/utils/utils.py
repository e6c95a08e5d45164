"""``torch_xla.utils.utils`` (``xu``): the helpers torch_xla scripts use."""

from __future__ import annotations

import os
import socket
import sys


class SampleGenerator:
    """An iterator returning ``data`` ``sample_count`` times (a synthetic ``DataLoader``)."""

    def __init__(self, data, sample_count: int):
        self._data = data
        self._sample_count = sample_count
        self._count = 0

    def __iter__(self):
        return SampleGenerator(self._data, self._sample_count)

    def __len__(self):
        return self._sample_count

    def __next__(self):
        if self._count >= self._sample_count:
            raise StopIteration
        self._count += 1
        return self._data

    next = __next__


def as_list(t):
    return t if isinstance(t, (tuple, list)) else [t]


def getenv_as(name: str, type, defval=None):
    env = os.environ.get(name)
    if env is None:
        return defval
    return bool(int(env)) if type is bool else type(env)


def check_env_flag(name: str, default: str = "") -> bool:
    flag = os.getenv(name, default)
    return flag == "true" or (flag.isdigit() and int(flag) > 0)


def for_each_instance(value, select_fn, fn) -> None:
    seen = set()

    def visit(v):
        if id(v) in seen:
            return
        seen.add(id(v))
        if select_fn(v):
            fn(v)
        elif isinstance(v, dict):
            for k, x in v.items():
                visit(k)
                visit(x)
        elif isinstance(v, (list, tuple, set)):
            for x in v:
                visit(x)

    visit(value)


def for_each_instance_rewrite(value, select_fn, fn):
    def rewrite(v):
        if select_fn(v):
            return fn(v)
        if isinstance(v, dict):
            return {k: rewrite(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return type(v)(rewrite(x) for x in v)
        return v

    return rewrite(value)


def null_print(*args, **kwargs) -> None:
    pass


def eprint(*args, **kwargs) -> None:
    print(*args, file=sys.stderr, **kwargs)


def get_free_tcp_ports(n: int = 1) -> list[int]:
    ports, sockets = [], []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("", 0))
        sockets.append(s)
        ports.append(s.getsockname()[1])
    for s in sockets:
        s.close()
    return ports
