"""How a tensor's stored bytes become the values ``stats`` and ``diff`` work on: those of
its ``.npy`` view, converted by the one driver (``tensorfs.convert.blocks``).
"""

from __future__ import annotations

from typing import NamedTuple

from tensorfs.convert.blocks import convert_blocks
from tensorfs.convert.plan import ViewPlan, plan_view
from tensorfs.model import TensorInfo
from tensorfs.runtime.libraries import np


class Values(NamedTuple):
    """How a tensor's stored bytes become the values of its ``.npy`` view: whole units of
    ``unit_bytes`` stored bytes give ``unit_elems`` values each."""

    plan: ViewPlan
    unit_elems: int
    unit_bytes: int

    @property
    def exists(self) -> bool:
        return self.plan.kind is not None

    def of(self, raw: np.ndarray, out32: np.ndarray | None = None) -> np.ndarray:
        """The values of ``raw`` (uint8, whole units): the view's own dtype for a native type,
        float32 for a converted one (into ``out32`` when given)."""
        if self.plan.kind == "native":
            return raw.view(np.dtype(self.plan.npy_dtype))
        return convert_blocks(self.plan.conversion, raw, out32)


def values_of(tensor: TensorInfo, plan: ViewPlan | None = None) -> Values:
    plan = plan or plan_view(tensor)
    if plan.kind == "native":
        return Values(plan, 1, np.dtype(plan.npy_dtype).itemsize)
    if plan.kind == "converted":
        return Values(plan, plan.conversion.block_elems, plan.conversion.block_bytes)
    return Values(plan, 1, 1)
