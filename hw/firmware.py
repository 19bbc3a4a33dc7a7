"""Building firmware for the :class:`systolic.hw.cpu.CPU` core with the clang inside the
``ziglang`` wheel (pip only: no cross toolchain to install).

:func:`build_firmware` compiles C and assembly sources for RV32I + Zmmul, links them at address 0
into one memory of ``ram_bytes`` bytes (code, read-only data, data and zeroed data in that order,
the stack at the top) and returns the memory image. It is linked without the C library and
without compiler-rt: a division or another routine the core cannot execute fails the link,
naming the symbol.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["FirmwareError", "CFLAGS", "build_firmware", "image_words"]

#: Target and code generation flags (the core implements RV32I and Zmmul, nothing else).
CFLAGS = ("-target", "riscv32-freestanding-none", "-mcpu=generic_rv32+zmmul", "-Os", "-nostdlib",
          "-ffreestanding", "-fno-builtin", "-fno-pic", "-Wall", "-Werror")

_LINKER_SCRIPT = """\
ENTRY(_start)
MEMORY {{ RAM (rwx) : ORIGIN = 0, LENGTH = {ram_bytes} }}
SECTIONS {{
  .text : {{ KEEP(*(.text.start)) *(.text .text.*) }} > RAM
  .rodata : {{ *(.rodata .rodata.* .srodata .srodata.*) }} > RAM
  .data : {{ *(.data .data.* .sdata .sdata.*) }} > RAM
  .bss (NOLOAD) : {{ __bss_start = .; *(.bss .bss.* .sbss .sbss.* COMMON) __bss_end = .; }} > RAM
  __stack_top = ORIGIN(RAM) + LENGTH(RAM);
  ASSERT(__stack_top - __bss_end >= {stack_bytes},
         "firmware: less than {stack_bytes} bytes left for the stack")
{data_rule}}}
"""
_NO_DATA = """  ASSERT(SIZEOF(.data) == 0, "firmware: no initialized writable data allowed (it would not be \
reinitialized when the core restarts)")
"""


class FirmwareError(Exception):
    """The firmware could not be built (no compiler, a compile or link error, too large)."""


def _zig() -> list[str]:
    if importlib.util.find_spec("ziglang") is None:
        raise FirmwareError("building firmware needs the ziglang package (pip install ziglang; it is in "
                            "systolic's dev extra)")
    return [sys.executable, "-m", "ziglang"]


def build_firmware(sources: Sequence[str | Path], *, ram_bytes: int, stack_bytes: int = 256,
                   defines: Mapping[str, int] | None = None, include: Sequence[str | Path] = (),
                   writable_data: bool = True) -> bytes:
    """The memory image (bytes from address 0) of ``sources`` (``.c``, ``.S``) built for the core.

    ``defines`` become ``-DNAME=value``; ``include`` are extra include directories. The image
    holds code and initialized data; the zeroed data and the stack follow it in the same
    ``ram_bytes`` memory, at least ``stack_bytes`` of it left for the stack. Without
    ``writable_data`` the link fails if there is initialized writable data (firmware that the
    core restarts without reloading its memory must not have any).
    """
    if not isinstance(ram_bytes, int) or ram_bytes <= 0 or ram_bytes % 4:
        raise ValueError(f"ram_bytes must be a positive multiple of 4, not {ram_bytes!r}")
    paths = [Path(s) for s in sources]
    for path in paths:
        if not path.is_file():
            raise FirmwareError(f"firmware source {path} does not exist")
    zig = _zig()
    with tempfile.TemporaryDirectory(prefix="systolic-fw-") as tmp:
        tmpdir = Path(tmp)
        script = tmpdir / "link.ld"
        script.write_text(_LINKER_SCRIPT.format(ram_bytes=ram_bytes, stack_bytes=stack_bytes,
                                                data_rule="" if writable_data else _NO_DATA))
        elf, binary = tmpdir / "firmware.elf", tmpdir / "firmware.bin"
        flags = [*CFLAGS, *(f"-D{k}={v}" for k, v in (defines or {}).items()),
                 *(f"-I{d}" for d in include)]
        cmd = [*zig, "cc", *flags, "-T", str(script), "-o", str(elf), *map(str, paths)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode:
            raise FirmwareError(f"building firmware from {', '.join(p.name for p in paths)} failed:\n"
                                f"{(result.stderr or result.stdout).strip()}")
        result = subprocess.run([*zig, "objcopy", "-O", "binary", str(elf), str(binary)],
                                capture_output=True, text=True)
        if result.returncode:
            raise FirmwareError(f"zig objcopy failed: {(result.stderr or result.stdout).strip()}")
        image = binary.read_bytes()
    if len(image) > ram_bytes:      # the linker's MEMORY check catches this first
        raise FirmwareError(f"firmware image is {len(image)} bytes, the memory holds {ram_bytes}")
    return image


def image_words(image: bytes, depth: int) -> list[int]:
    """``image`` as ``depth`` little-endian 32-bit words, zero past its end (a memory's init)."""
    if len(image) > 4 * depth:
        raise ValueError(f"a {len(image)}-byte image does not fit {depth} words")
    padded = image + bytes(4 * depth - len(image))
    return [int.from_bytes(padded[4 * i:4 * i + 4], "little") for i in range(depth)]
