"""``systolic generate``: the Verilog of an accelerator and the description a host needs.

Writes into a directory:

* ``systolic_top.v`` — the top level (:class:`~systolic.hw.top.Accelerator`) as Verilog;
* ``config.toml`` and ``config.json`` — the resolved configuration (and its hash);
* ``interface.json`` — the ports of ``systolic_top`` (name, direction, width), the AXI4 and
  AXI4-Lite parameters, the CSR map (name, byte offset, access, meaning), the error codes and the
  counters.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .config import AcceleratorConfig
from .csr import COUNTERS, CSR_ADDR_BITS, ERROR_CODES, register_map
from .isa import INSTR_BYTES, ISA_VERSION

__all__ = ["TOP_NAME", "generate", "interface", "top_verilog"]

TOP_NAME = "systolic_top"


def top_verilog(config: AcceleratorConfig) -> str:
    """Verilog text of the whole accelerator for ``config`` (module ``systolic_top``)."""
    from amaranth.back import verilog

    from .top import Accelerator

    top = Accelerator(config)
    return verilog.convert(top, name=TOP_NAME, emit_src=False)


def interface(config: AcceleratorConfig) -> dict[str, Any]:
    """JSON-ready description of ``systolic_top``'s ports and registers."""
    from .top import top_ports

    ports = [{"name": "clk", "direction": "in", "width": 1},
             {"name": "rst", "direction": "in", "width": 1, "doc": "synchronous, active high"}]
    for name, (direction, width) in top_ports(config).items():
        ports.append({"name": name, "direction": direction, "width": width})
    return {
        "module": TOP_NAME,
        "config_hash": config.hash_hex,
        "isa_version": ISA_VERSION,
        "instruction_bytes": INSTR_BYTES,
        "ports": ports,
        "axi4": {"prefix": "m_axi_", "addr_width": 32, "data_width": config.dma_data_bits,
                 "max_burst_beats": config.dma_max_burst, "burst": "INCR", "ids": 1},
        "axi4_lite": {"prefix": "s_axil_", "addr_width": CSR_ADDR_BITS, "data_width": 32},
        "registers": register_map(),
        "error_codes": {str(code): meaning for code, meaning in ERROR_CODES.items()},
        "counters": {name: doc for name, doc in COUNTERS},
    }


def generate(config: AcceleratorConfig, out_dir: str | Path) -> dict[str, Path]:
    """Write the Verilog, the resolved config and the interface description into ``out_dir``
    (created if needed); returns the written paths by kind."""
    if not isinstance(config, AcceleratorConfig):
        raise TypeError(f"config must be an AcceleratorConfig, not {config!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "verilog": out / f"{TOP_NAME}.v",
        "config_toml": out / "config.toml",
        "config_json": out / "config.json",
        "interface": out / "interface.json",
    }
    paths["verilog"].write_text(top_verilog(config))
    config.save(paths["config_toml"])
    paths["config_json"].write_text(json.dumps({"hash": config.hash_hex, "fields": config.to_dict()},
                                               indent=2) + "\n")
    paths["interface"].write_text(json.dumps(interface(config), indent=2) + "\n")
    return paths
