"""A stand-in for an Amaranth Lattice ECP5 platform, for tests that elaborate ECP5 gateware
(``hw/dsp.py`` ``is_ecp5``) without building for a board."""


class Ecp5Stand:
    """Stands in for an Amaranth Lattice ECP5 platform: elaboration reads only ``family``."""
    family = "ecp5"


def async_set_flip_flops(component, platform, netlist) -> int:
    """Flip-flops with an asynchronous set (TRELLIS_FF, SRMODE ASYNC, REGSET SET: reset
    synchronizers' stages) in yosys's synth_ecp5 netlist of ``component`` (top module ``top``)
    elaborated for ``platform``; the JSON netlist is written to ``netlist``."""
    import json

    from amaranth.back import rtlil
    from systolic.sim.tools import yosys_synth

    yosys_synth(rtlil.convert(component, name="top", platform=platform), "top", "ecp5", netlist=netlist,
                rtlil=True)
    cells = json.loads(netlist.read_text())["modules"]["top"]["cells"].values()
    return sum(cell["type"] == "TRELLIS_FF" and cell["parameters"].get("SRMODE") == "ASYNC"
               and cell["parameters"].get("REGSET") == "SET" for cell in cells)
