"""A stand-in accelerator for CPU tests: tensors that report the `meta` device but hold CPU data.

On a CPU machine every tensor is on the CPU, so a tensor that code forgets to move to the model's
device goes unnoticed until the first GPU run. Inside `stand_in_accelerator()` a model loaded with
`device="meta"` computes for real (on the host), and every op that mixes a stand-in tensor with a
host tensor raises `DeviceMismatch`, as CUDA would: a host tensor may only be read as a 0-dim
scalar, never written with device data (`host_total += device_loss`). Reading device data on the
host (`.item()`, `.tolist()`, `.cpu()`) is allowed, as on a GPU (a sync there).

The context is process-wide: torch's modes are per thread, so threads started inside it (the
orchestrator, the engine's scheduler) enter it too; inference mode becomes no_grad (inference
tensors cannot be tensor subclasses). Not for collectives: one process only."""

from __future__ import annotations

import contextlib
import threading

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

DEVICE = torch.device("meta")


class DeviceMismatch(RuntimeError):
    pass


class OnDevice(torch.Tensor):
    """Host data that says it lives on the stand-in device."""

    @staticmethod
    def __new__(cls, data: torch.Tensor):
        t = torch.Tensor._make_wrapper_subclass(cls, data.shape, strides=data.stride(),
                                                storage_offset=data.storage_offset(), dtype=data.dtype,
                                                device=DEVICE, requires_grad=data.requires_grad)
        t.data_ = data
        return t

    def __repr__(self):
        return f"OnDevice({self.data_!r})"

    @property
    def is_meta(self) -> bool:  # it holds data: `load_state_dict` must copy into it, as into a CUDA tensor
        return False

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in HOST_READS:  # the host reads device data (a sync on a GPU): allowed
            return func(*tree_map(_host, args), **tree_map(_host, kwargs))
        if func == torch.Tensor.data.__set__ and isinstance(args[1], OnDevice):  # `p.data = t` (module.to, casts)
            args[0].data_ = args[1].data_
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


HOST_READS = {torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.__reduce_ex__}
COPIES = {torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default}  # may cross devices
TO_HOST = {torch.ops.aten._local_scalar_dense.default}


def _host(x):
    return x.data_.detach() if isinstance(x, OnDevice) else x


def _run(func, args, kwargs):
    seen = set()
    written = {a.name for a in func._schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    names = [a.name for a in func._schema.arguments]

    def note(x, is_written: bool) -> None:
        if isinstance(x, OnDevice):
            seen.add("device")
        elif isinstance(x, torch.Tensor) and (x.dim() > 0 or is_written):
            seen.add("cpu")  # a host 0-dim tensor may be read by a device op, not written with one

    for name, a in [*zip(names, args), *kwargs.items()]:
        is_written = name in written
        tree_map(lambda x, w=is_written: note(x, w), a)
    if len(seen) > 1 and func not in COPIES:
        raise DeviceMismatch(f"{func}: Expected all tensors to be on the same device, but found at least two "
                             f"devices, {DEVICE} (the stand-in accelerator) and cpu!")
    dev = kwargs.get("device")
    target = None if dev is None else torch.device(dev).type
    host_args, host_kwargs = tree_map(_host, args), tree_map(_host, kwargs)
    if target == DEVICE.type:
        host_kwargs["device"] = torch.device("cpu")
    out = func(*host_args, **host_kwargs)
    if func is torch.ops.aten.copy_.default:
        on_device = isinstance(args[0], OnDevice)
    else:
        on_device = target == DEVICE.type or (target is None and "device" in seen and func not in TO_HOST)
    if not on_device:
        return out
    return tree_map(lambda x: OnDevice(x) if isinstance(x, torch.Tensor) and not isinstance(x, OnDevice) else x, out)


class _Dispatch(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


class _Constructors(TorchFunctionMode):
    """torch.tensor/as_tensor build from Python data outside the dispatcher's modes: on the stand-in
    device they would be real (empty) meta tensors, so they are built on the host and wrapped."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        dev = kwargs.get("device")
        if func in (torch.tensor, torch.as_tensor) and dev is not None and torch.device(dev).type == DEVICE.type:
            kwargs["device"] = "cpu"
            with torch._C.DisableTorchFunction():
                return OnDevice(func(*args, **kwargs))
        return func(*args, **kwargs)


@contextlib.contextmanager
def stand_in_accelerator():
    """Yields the stand-in device (`meta`): pass it where a run would name `cuda`."""
    run = threading.Thread.run

    def run_inside(thread):
        with _Dispatch(), _Constructors():
            run(thread)

    threading.Thread.run = run_inside
    inference_mode, torch.inference_mode = torch.inference_mode, torch.no_grad
    try:
        with _Dispatch(), _Constructors():
            yield DEVICE
    finally:
        threading.Thread.run = run
        torch.inference_mode = inference_mode
