"""The serial special-function unit (``sfu_engine = "serial"``): the SFU's arithmetic one channel at
a time through one 64-bit adder, for FPGAs where logic, not speed, is scarce.

:class:`SerialSpecialFunctionUnit` has the ports of :class:`~systolic.hw.sfu.SpecialFunctionUnit`
and computes the same outputs, bit for bit (:func:`~systolic.sim.arith.sfu_pointwise`,
max pooling, :func:`~systolic.sim.arith.avg_pool_finish`), but holds an input beat (it takes the
beat when its last channel is done) and works through its channels in turn, each through:

* **bias**: ``t = sat(acc + bias)`` (one cycle, the channel's multiplication set up);
* **multiply**: ``x = t * mult`` by shift and add, one multiplier bit per cycle (32 cycles; the
  multiplier's bit 31 subtracts), into a 64-bit register that wraps like the reference; with a
  residual, ``x += (r - res_zp) * res_mult`` the same way (32 more);
* **round**: for a shift s > 0, ``x + 2**(s-1)`` (wrapping as the reference does), shifted right
  by s (8 bits a cycle while 8 or more are left, then one), the bits shifted out ORed into a
  sticky bit: a tie shifts out only zeros (the low s bits of x were exactly 2**(s-1));
* **zero point** (one cycle, a tie made even before or after it by ``tie_out``), then the
  **activation and saturation** as one clamp of the value narrowed to 19 bits (one cycle), into
  the channel's output, or its running max (a pad pixel only starts a window at the lowest
  value) or running sum (a pad pixel adds ``zp_out``) of a pooling window.

An average window ends, after its last beat, with ``count * zp_out`` (one multiplication), then
per channel the centred sum times ``avg_mult``, rounded by ``avg_shift`` the same way. The output
row is a register, offered until taken; a beat that makes an output starts only once the last
output leaves (in that cycle at the latest). ``out_type = raw`` beats pass in one cycle. Modes
the config lacks (``sfu_pooling``, ``sfu_residual``) build no logic. :func:`serial_sfu_cycles`
gives the cycles of a STORE's beats for the golden model's estimate.
"""

from __future__ import annotations

from amaranth import Array, Module, Mux, Signal, signed

from .accumulator import acc_elem_shape
from .isa import OutType, PoolMode
from .sfu import (
    _NARROW,
    _SUM_BITS,
    _WORD,
    SFUPorts,
    _clear_lsb,
    _half,
    _saturate,
    _select,
    activation_clamp,
    output_elem_shape,
)

__all__ = ["SerialSpecialFunctionUnit", "serial_channel_cycles", "serial_sfu_cycles"]

#: Cycles of one multiplication: one per multiplier bit.
_MUL_CYCLES = 32


def serial_round_cycles(shift: int) -> int:
    """Cycles of the rounding by ``shift``: the cycle that adds 2**(shift-1), then for shift > 0
    the shift (8 bits or 1 bit a cycle) and the cycle that decides the tie."""
    if shift == 0:
        return 1
    return 1 + shift // 8 + shift % 8 + 1


def serial_channel_cycles(shift: int, residual: bool) -> int:
    """Cycles of one channel of a beat that is not padding: bias, the multiplication(s), the
    rounding by ``shift``, zero point, activation."""
    return 1 + _MUL_CYCLES * (2 if residual else 1) + serial_round_cycles(shift) + 2


def serial_sfu_cycles(shifts: list[int], *, raw: bool, residual: bool, pixels: int, pad_pixels: int,
                      avg_windows: int = 0, avg_shift: int = 0) -> int:
    """Cycles the serial SFU is busy with a STORE whose channels have the rounding ``shifts``
    (one per channel), its beats offered back to back and its outputs taken at once: per beat
    a cycle to start it, then per channel :func:`serial_channel_cycles` for the ``pixels`` beats
    that are not padding and one cycle for the ``pad_pixels`` that are; ``avg_windows`` average
    windows finished (one ``count * zp_out`` multiplication, then per channel a centring cycle,
    the multiplication, the rounding by ``avg_shift``, zero point and activation). Raw beats take
    one cycle each. The last output is valid :data:`~systolic.hw.sfu.SERIAL_LATENCY` cycle
    later."""
    if raw:
        return pixels
    per_pixel = 1 + sum(serial_channel_cycles(s, residual) for s in shifts)
    finish = 1 + _MUL_CYCLES + len(shifts) * (1 + _MUL_CYCLES + serial_round_cycles(avg_shift) + 2)
    return pixels * per_pixel + pad_pixels * (1 + len(shifts)) + avg_windows * finish


class SerialSpecialFunctionUnit(SFUPorts):
    """The SFU, one channel at a time (module docstring). Ports, settings and their timing as
    :class:`~systolic.hw.sfu.SpecialFunctionUnit`'s; ``idle``: no beat is being worked on."""

    def elaborate(self, platform: object) -> Module:
        cfg = self.config
        m = Module()
        C = cfg.cols
        has_residual = cfg.sfu_residual
        has_max = "max" in cfg.sfu_pooling
        has_avg = "avg" in cfg.sfu_pooling
        out_lo, _ = cfg.output_range
        acc_width = cfg.acc_bits + int(not cfg.acc_signed)     # as a signed value
        regs, settings = self.regs, self.settings
        beat = self.i.payload

        # -- settings, registered (stable during a STORE) --------------------------------------
        raw = Signal()
        zp = Signal(signed(16))
        tie_out = Signal()
        m.d.sync += [raw.eq(settings.out_type == OutType.RAW), zp.eq(regs.zp_out),
                     tie_out.eq(regs.tie_out)]
        clamp_lo, clamp_hi, clamp_empty = Signal(signed(17)), Signal(signed(17)), Signal()
        activation_clamp(m, cfg, settings, regs, clamp_lo, clamp_hi, clamp_empty)
        residual_on = Signal()
        res_zp = Signal(signed(16))
        res_mult = Signal(signed(32))
        if has_residual:
            m.d.sync += [residual_on.eq(settings.residual & (settings.out_type != OutType.RAW)),
                         res_zp.eq(regs.res_zp), res_mult.eq(regs.res_mult)]
        pool_max = Signal()
        pool_avg = Signal()
        avg_mult = Signal(signed(32))
        avg_shift = Signal(6)
        avg_tie_out = Signal()
        pool_count = Signal(16)
        is_int = settings.out_type != OutType.RAW
        if has_max:
            m.d.sync += pool_max.eq(is_int & (settings.pool == PoolMode.MAX))
        if has_avg:
            m.d.sync += [pool_avg.eq(is_int & (settings.pool == PoolMode.AVG)),
                         avg_mult.eq(regs.avg_mult), avg_shift.eq(regs.avg_shift),
                         avg_tie_out.eq(regs.avg_tie_out), pool_count.eq(settings.pool_count)]

        # -- state ------------------------------------------------------------------------------
        channel = Signal(range(C))
        last_channel = channel == C - 1
        x = Signal(signed(_WORD))             # the product, then the rounding, then the value
        a = Signal(signed(_WORD))             # the multiplicand, shifted left a bit a cycle
        b = Signal(signed(32))                # the multiplier, shifted right a bit a cycle
        step = Signal(range(_MUL_CYCLES))
        phase = Signal(2)                     # the multiplication: 0 t * mult, 1 residual,
        PRODUCT, RESIDUAL, COUNT, AVERAGE = range(4)   # 2 count * zp_out, 3 centred * avg_mult
        left = Signal(6)                      # bits still to shift
        sticky = Signal()
        tie = Signal()
        finishing = Signal()                  # an average window's finish
        count_zp = Signal(signed(33))
        outs = [Signal(acc_elem_shape(cfg), name=f"out{c}") for c in range(C)]
        out = Array(outs)
        out_valid = Signal()
        run_max = Array(Signal(output_elem_shape(cfg), name=f"run_max{c}") for c in range(C))
        run_sum = Array(Signal(signed(_SUM_BITS), name=f"run_sum{c}") for c in range(C))

        pooling = pool_max | pool_avg
        makes_output = ~pooling | beat.last
        acc_c = beat.acc[channel]
        entry = self.params[channel]

        # the one adder: x (bit 0 cleared for a tie) + (a, -a or 0 in a multiplication; 1 in the
        # rounding; zp_out)
        operand = Signal(signed(_WORD))
        carry = Signal()
        clear = Signal()
        total = Signal(signed(_WORD))
        m.d.comb += total.eq((_clear_lsb(x, clear) + operand + carry)[:_WORD])

        # the activation's clamp of the value narrowed to 19 bits
        tie_mode = Mux(finishing, avg_tie_out, tie_out) if has_avg else tie_out
        narrow = Signal(signed(_NARROW))
        m.d.comb += narrow.eq(_saturate(_clear_lsb(x, tie & tie_mode), _NARROW, True))
        value = Signal(signed(_NARROW))
        m.d.comb += value.eq(_select(narrow, clamp_lo, clamp_hi, clamp_empty, narrow < clamp_lo,
                                     narrow > clamp_hi))

        m.d.comb += [self.o.valid.eq(out_valid), *(self.o.payload[c].eq(outs[c]) for c in range(C))]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += out_valid.eq(0)

        def start_multiply(multiplicand, multiplier, which: int) -> list:
            return [a.eq(multiplicand), b.eq(multiplier), x.eq(0), step.eq(0), phase.eq(which)]

        def channel_done() -> None:
            """The beat's channel is done: the next channel, or take the beat."""
            with m.If(~last_channel):
                m.d.sync += channel.eq(channel + 1)
                m.next = "ELEMENT"
            with m.Else():
                m.d.comb += self.i.ready.eq(1)
                m.d.sync += channel.eq(0)
                m.next = "IDLE"
                if has_avg:
                    with m.If(pool_avg & beat.last):
                        m.d.sync += finishing.eq(1)
                        m.next = "COUNT"
                with m.If(makes_output & ~(pool_avg & beat.last)):
                    m.d.sync += out_valid.eq(1)

        with m.FSM() as fsm:
            with m.State("IDLE"):
                # a beat that makes an output starts once the last output leaves (this cycle at
                # the latest), so that its channels may overwrite the output register
                out_free = ~out_valid | self.o.ready
                with m.If(self.i.valid & (~makes_output | out_free)):
                    with m.If(raw):
                        m.d.comb += self.i.ready.eq(1)
                        m.d.sync += [*(outs[c].eq(beat.acc[c]) for c in range(C)), out_valid.eq(1)]
                    with m.Else():
                        m.next = "ELEMENT"

            with m.State("ELEMENT"):
                with m.If(pooling & beat.pad):
                    # a pad pixel: max starts its window at the lowest value, avg adds zp_out
                    if has_max:
                        head = run_max[channel]
                        new_max = Mux(beat.first, out_lo, head)
                        with m.If(pool_max):
                            m.d.sync += head.eq(new_max)
                            with m.If(beat.last):
                                m.d.sync += out[channel].eq(new_max)
                    if has_avg:
                        with m.If(pool_avg):
                            m.d.sync += run_sum[channel].eq(Mux(beat.first, 0, run_sum[channel]) + zp)
                    channel_done()
                with m.Else():
                    t = Signal(signed(acc_width))
                    m.d.comb += t.eq(_saturate(acc_c + entry.bias, cfg.acc_bits, cfg.acc_signed))
                    m.d.sync += start_multiply(t, entry.mult, PRODUCT)
                    m.next = "MULTIPLY"

            with m.State("MULTIPLY"):
                # x += a * (bit `step` of the multiplier); its bit 31 has weight -2**31
                subtract = step == _MUL_CYCLES - 1
                m.d.comb += [operand.eq(Mux(b[0], Mux(subtract, ~a, a), 0)), carry.eq(b[0] & subtract)]
                m.d.sync += [x.eq(total), a.eq(a << 1), b.eq(b >> 1), step.eq(step + 1)]
                with m.If(step == _MUL_CYCLES - 1):
                    m.next = "ROUND"
                    with m.Switch(phase):
                        with m.Case(PRODUCT):
                            if has_residual:
                                with m.If(residual_on):
                                    res = Signal(signed(18))
                                    m.d.comb += res.eq(beat.residual[channel] - res_zp)
                                    m.d.sync += [a.eq(res), b.eq(res_mult), step.eq(0),
                                                 phase.eq(RESIDUAL)]
                                    m.next = "MULTIPLY"
                        if has_avg:
                            with m.Case(COUNT):
                                m.d.sync += count_zp.eq(total)
                                m.next = "CENTRE"

            with m.State("ROUND"):
                # x + 2**(s-1), wrapping as the reference does, then shifted right by s
                shift = Mux(finishing, avg_shift, entry.shift) if has_avg else entry.shift
                m.d.comb += operand.eq(_half(shift))
                m.d.sync += [x.eq(total), left.eq(shift), sticky.eq(0), tie.eq(0)]
                m.next = "SHIFT"
                with m.If(shift == 0):
                    m.next = "ZERO_POINT"

            with m.State("SHIFT"):
                # 8 bits a cycle while 8 or more are left, then one; a tie drops only zeros
                # (the low s bits of x were exactly 2**(s-1))
                with m.If(left >= 8):
                    m.d.sync += [x.eq(x >> 8), sticky.eq(sticky | x[:8].any()), left.eq(left - 8)]
                with m.Elif(left != 0):
                    m.d.sync += [x.eq(x >> 1), sticky.eq(sticky | x[0]), left.eq(left - 1)]
                with m.Else():
                    m.d.sync += tie.eq(~sticky)
                    m.next = "ZERO_POINT"

            with m.State("ZERO_POINT"):
                # the tie made even before the zero point (tie_out = 0) or after it (1)
                m.d.comb += [operand.eq(zp), clear.eq(tie & ~tie_mode)]
                m.d.sync += x.eq(total)
                m.next = "ACTIVATION"

            with m.State("ACTIVATION"):
                if has_avg:
                    with m.If(finishing):
                        m.d.sync += out[channel].eq(value)
                        with m.If(last_channel):
                            m.d.sync += [finishing.eq(0), out_valid.eq(1), channel.eq(0)]
                            m.next = "IDLE"
                        with m.Else():
                            m.d.sync += channel.eq(channel + 1)
                            m.next = "CENTRE"
                with m.If(~finishing):
                    with m.If(pool_max):
                        if has_max:
                            bits = cfg.output_bits
                            flip = 1 << (bits - 1) if cfg.output_signed else 0
                            head = run_max[channel]
                            bigger = (value[:bits] ^ flip) > (head[:bits] ^ flip)
                            new_max = Mux(beat.first | bigger, value, head)
                            m.d.sync += head.eq(new_max)
                            with m.If(beat.last):
                                m.d.sync += out[channel].eq(new_max)
                    with m.Elif(pool_avg):
                        if has_avg:
                            m.d.sync += run_sum[channel].eq(Mux(beat.first, 0, run_sum[channel]) + value)
                    with m.Else():
                        m.d.sync += out[channel].eq(value)
                    channel_done()

            if has_avg:
                with m.State("COUNT"):
                    # an average window's end: count * zp_out once for all channels
                    m.d.sync += start_multiply(zp, pool_count, COUNT)
                    m.next = "MULTIPLY"

                with m.State("CENTRE"):
                    centred = Signal(signed(_SUM_BITS + 1))
                    m.d.comb += centred.eq(run_sum[channel] - count_zp)
                    m.d.sync += start_multiply(centred, avg_mult, AVERAGE)
                    m.next = "MULTIPLY"

        m.d.comb += self.idle.eq(fsm.ongoing("IDLE"))
        return m
