"""``CheckpointManager``: torch_xla's manager of a training run's checkpoints, one DCP
checkpoint per step under ``path/<step>/``, written by ``SPMDSavePlanner`` and read by
``SPMDLoadPlanner`` (the same layout torch_xla writes: each step's directory holds DCP's
files and ``.manager_metadata``, the pickled step and time that marks it complete)."""

from __future__ import annotations

import logging
import os
import pickle
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

import torch.distributed as dist
import torch.distributed.checkpoint as dist_cp

import ir_runtime as _irt
import torch_xla
import torch_xla.core.xla_model as xm

from ._helpers import _sharded_cpu_state_dict
from .planners import SPMDLoadPlanner, SPMDSavePlanner

_MANAGER_METADATA_FILE = ".manager_metadata"


@dataclass
class _CheckpointMetadata:
    step: int
    ts: datetime


def _storage():
    """fsspec's writer and reader where fsspec is installed (any fsspec URL), else DCP's
    local file system ones."""
    try:
        from fsspec.core import url_to_fs
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

        return url_to_fs, FsspecWriter, FsspecReader
    except ImportError:
        from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

        return None, FileSystemWriter, FileSystemReader


class _LocalFS:
    """The few file system calls the manager makes, on local paths (no fsspec)."""

    def exists(self, p):
        return os.path.exists(p)

    def mkdir(self, p):
        os.makedirs(p, exist_ok=True)

    def ls(self, p, detail=False):
        return [os.path.join(p, n) for n in sorted(os.listdir(p))]

    def open(self, p, mode="rb"):
        return open(p, mode)

    def rm(self, p, recursive=False):
        import shutil

        shutil.rmtree(p)


class CheckpointManager:
    """Checkpoints of a training run under ``path``: ``save``/``save_async`` every
    ``save_interval`` steps (or when forced, or at a preemption), the oldest beyond
    ``max_to_keep`` deleted, ``restore(step, state_dict)`` in place, ``all_steps()``.
    Needs a process group (``dist.init_process_group("gloo", init_method="xla://")``)."""

    def __init__(
        self,
        path: str,
        save_interval: int,
        max_to_keep: int | None = 0,
        max_pending_async: int | None = 1,
        num_of_threads: int | None = 1,
        process_group=None,
        chkpt_on_preemption: bool = True,
    ):
        assert dist.is_initialized(), "A process group is required."
        assert save_interval > 0, "save_interval must be positive"
        assert max_pending_async > 0, "max_pending_async must be positive"
        assert max_to_keep >= 0, "max_to_keep must be non-negative"
        self.base_path = os.path.join(path, "")
        self.save_interval = save_interval
        self.max_to_keep = max_to_keep
        self.num_of_threads = num_of_threads
        self.chkpt_on_preemption = chkpt_on_preemption
        self.pg = process_group or dist.new_group()
        self._async_worker_pool = ThreadPoolExecutor(max_workers=1)
        self._async_sem = threading.Semaphore(max_pending_async)
        self._async_futures = []
        self._save_mutex = threading.Lock()
        self._url_to_fs, self._writer, self._reader = _storage()
        self._tracked_chkpts = self._load_tracked_chkpts()

    def _fs(self, path):
        if self._url_to_fs is None:
            return _LocalFS(), path
        return self._url_to_fs(path)

    def _load_tracked_chkpts(self):
        found, invalid = [], []
        fs, raw = self._fs(self.base_path)
        if not fs.exists(raw):
            fs.mkdir(raw)
        else:
            for path in fs.ls(raw, detail=False):
                try:
                    with fs.open(os.path.join(path, _MANAGER_METADATA_FILE), "rb") as f:
                        found.append(pickle.load(f))
                except Exception:
                    invalid.append(path)
        if invalid:
            logging.warning(f"Ignoring invalid checkpoints: {invalid}")
        return deque(sorted(found, key=lambda m: m.ts))

    def _get_path(self, step: int) -> str:
        return os.path.join(self.base_path, str(step))

    def _delete_chkpt_at_step(self, step) -> None:
        if dist.get_rank(self.pg) == 0:
            fs, raw = self._fs(self._get_path(step))
            if fs.exists(raw):
                fs.rm(raw, recursive=True)

    def _release_oldest_checkpoints(self) -> None:
        if self.max_to_keep > 0:
            while len(self._tracked_chkpts) > self.max_to_keep:
                self._delete_chkpt_at_step(self._tracked_chkpts.popleft().step)

    def _wait_for_data(self) -> None:
        torch_xla.sync()
        xm.wait_device_ops()

    def _save(self, step, state_dict) -> None:
        with self._save_mutex:
            path = self._get_path(step)
            self._delete_chkpt_at_step(step)
            kwargs = {"thread_count": self.num_of_threads}
            dist_cp.save(
                state_dict=state_dict,
                storage_writer=self._writer(path, **kwargs),
                planner=SPMDSavePlanner(),
                process_group=self.pg,
            )
            metadata = _CheckpointMetadata(step=step, ts=datetime.now())
            self._tracked_chkpts.append(metadata)
            if dist.get_rank(self.pg) == 0:
                fs, raw = self._fs(os.path.join(path, _MANAGER_METADATA_FILE))
                with fs.open(raw, "wb") as f:
                    pickle.dump(metadata, f)
                self._release_oldest_checkpoints()

    def should_save(self, step: int) -> bool:
        """On the save interval, or at a preemption (``chkpt_on_preemption``)."""
        preempted = self.chkpt_on_preemption and self.reached_preemption(step)
        if preempted:
            logging.warning(f"Preemption sync point reached at step {step}. Checkpointing.")
        return step % self.save_interval == 0 or preempted

    def save(self, step, state_dict, force: bool | None = False) -> bool:
        if self.should_save(step) or force:
            self._wait_for_data()
            self._save(step, state_dict)
            return True
        return False

    def save_async(self, step: int, state_dict, force: bool | None = False) -> bool:
        """``save`` on a worker thread, from a copy of this process's blocks on the CPU
        (taken before it returns); at most ``max_pending_async`` saves wait at once."""
        if self.should_save(step) or force:
            self._wait_for_data()
            cpu_state_dict = _sharded_cpu_state_dict(state_dict)
            self._async_sem.acquire()
            future = self._async_worker_pool.submit(self._save, step, cpu_state_dict)
            future.add_done_callback(lambda _: self._async_sem.release())
            self._async_futures.append(future)
            return True
        return False

    def restore(self, step: int, state_dict) -> None:
        """Load the checkpoint of ``step`` into ``state_dict`` in place (each engine tensor
        keeps its sharding); ``model.load_state_dict`` is the caller's, for other values."""
        tracked = {m.step for m in self._tracked_chkpts}
        assert step in tracked, (
            f"Cannot restore from untracked step {step}. Valid steps are: {tracked}"
        )
        dist_cp.load(
            state_dict=state_dict,
            storage_reader=self._reader(self._get_path(step)),
            planner=SPMDLoadPlanner(),
            process_group=self.pg,
        )

    def all_steps(self) -> list[int]:
        return sorted(m.step for m in self._tracked_chkpts)

    def join(self) -> None:
        for f in self._async_futures:
            f.result()
        self._async_futures = []

    def reached_preemption(self, step: int) -> bool:
        """Whether the processes agreed a preemption is under way at ``step`` (jax's
        preemption sync point, where the processes were started through the coordinator); a
        process started alone has no preemption notice to receive: False."""
        if _irt.process_count() == 1:
            return False
        from jax.experimental import multihost_utils

        return bool(multihost_utils.reached_preemption_sync_point(step))
