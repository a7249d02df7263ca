"""What each tensor is served as: its raw file always, and which kind of .npy view.

One decision, made in one place, read by the tree builder, metadata.json and ``inspect``.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorfs import convert
from tensorfs.dtypes import native_numpy_dtype
from tensorfs.model import TensorInfo


@dataclass(frozen=True)
class ViewPlan:
    kind: str | None              # "native" | "converted" | None (raw file only)
    npy_dtype: str | None         # the .npy view's dtype, None when there is no view
    conversion: convert.Conversion = None     # for "converted"
    reason: str | None = None     # why there is no view


def plan_view(tensor: TensorInfo) -> ViewPlan:
    native = native_numpy_dtype(tensor)
    if native is not None:
        return ViewPlan("native", native)
    conversion = convert.conversion_for(tensor)
    if conversion is not None:
        return ViewPlan("converted", "<f4", conversion)
    reason = convert.raw_only_reason(tensor)
    return ViewPlan(None, None, None, reason or f"no conversion for {tensor.dtype}")


class Plans:
    """``plan_view`` made once per stored type: a plan depends on the type alone (dtype,
    GGML type, byte order), and a model has thousands of tensors of a few types."""

    def __init__(self):
        self._by_type: dict[tuple, ViewPlan] = {}

    def __call__(self, tensor: TensorInfo) -> ViewPlan:
        key = (tensor.dtype, tensor.ggml_type, tensor.byte_order)
        plan = self._by_type.get(key)
        if plan is None:
            plan = self._by_type[key] = plan_view(tensor)
        return plan
