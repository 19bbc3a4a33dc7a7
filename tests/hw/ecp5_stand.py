"""A stand-in for an Amaranth Lattice ECP5 platform, for tests that elaborate ECP5 gateware
(``hw/dsp.py`` ``is_ecp5``) without building for a board."""


class Ecp5Stand:
    """Stands in for an Amaranth Lattice ECP5 platform: elaboration reads only ``family``."""
    family = "ecp5"
