"""systolic.hw.controller: construction errors of the instruction queues (their behaviour is
checked through the whole accelerator in tests/hw/test_top.py and the RTL program tests)."""

from typing import Any

import pytest
from amaranth.hdl import Fragment
from systolic.hw.config import AcceleratorConfig
from systolic.hw.controller import InstructionQueue
from systolic.hw.isa import Queue

from .test_scratchpad import construct_rejected


@pytest.mark.parametrize("depth", [0, 257, 2.0, "4"])
def test_instruction_queue_depth_must_be_1_to_256(depth: Any) -> None:
    with pytest.raises(ValueError, match=rf"^depth must be an integer between 1 and 256, "
                                         rf"not {depth!r}$"):
        construct_rejected(lambda: InstructionQueue(AcceleratorConfig(), Queue.LOAD, depth))


@pytest.mark.parametrize("depth", [1, 2, 256])
def test_instruction_queue_accepts_its_depths(depth: int) -> None:
    queue = InstructionQueue(AcceleratorConfig(), Queue.STORE, depth)
    assert queue.depth == depth
    Fragment.get(queue, None)       # elaborates at that depth
