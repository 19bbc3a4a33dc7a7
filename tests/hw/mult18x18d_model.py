"""A behavioural Verilog model of the Lattice MULT18X18D in the modes hw/dsp.py uses: the output
register on CLK0/CE0/RST0 with a synchronous reset, the A and B input registers either both on
CLK0/CE0/RST0 or both unused ("NONE"), no pipeline register; any other mode stops the
simulation. SIGNEDA and SIGNEDB are registered with the operands when those are (hw/dsp.py ties
them to constants, so the choice does not matter to the designs tested)."""

_MODEL_BODY = """\
  wire [17:0] a = {A17, A16, A15, A14, A13, A12, A11, A10, A9, A8, A7, A6, A5, A4, A3, A2, A1, A0};
  wire [17:0] b = {B17, B16, B15, B14, B13, B12, B11, B10, B9, B8, B7, B6, B5, B4, B3, B2, B1, B0};
  localparam bit REG_IN = REG_INPUTA_CLK == "CLK0";
  reg [17:0] ra = 0, rb = 0;
  reg sa = 0, sb = 0;
  reg [35:0] rp = 0;
  wire [17:0] ua = REG_IN ? ra : a;
  wire [17:0] ub = REG_IN ? rb : b;
  wire ssa = REG_IN ? sa : SIGNEDA;
  wire ssb = REG_IN ? sb : SIGNEDB;
  wire signed [36:0] ea = ssa ? {{19{ua[17]}}, ua} : {19'b0, ua};
  wire signed [36:0] eb = ssb ? {{19{ub[17]}}, ub} : {19'b0, ub};
  wire signed [73:0] product = ea * eb;
  initial begin
    if (!(REG_INPUTA_CLK == REG_INPUTB_CLK && (REG_INPUTA_CLK == "CLK0" || REG_INPUTA_CLK == "NONE")) ||
        REG_OUTPUT_CLK != "CLK0" ||
        REG_INPUTA_CE != "CE0" || REG_INPUTB_CE != "CE0" || REG_OUTPUT_CE != "CE0" ||
        REG_INPUTA_RST != "RST0" || REG_INPUTB_RST != "RST0" || REG_OUTPUT_RST != "RST0" ||
        RESETMODE != "SYNC")
      $fatal(1, "MULT18X18D model: unsupported register mode");
  end
  always @(posedge CLK0) begin
    if (RST0) begin
      ra <= 0; rb <= 0; sa <= 0; sb <= 0; rp <= 0;
    end else if (CE0) begin
      ra <= a; rb <= b; sa <= SIGNEDA; sb <= SIGNEDB; rp <= product[35:0];
    end
  end
"""


def mult18x18d_model() -> str:
    """The model's Verilog text (module ``MULT18X18D``, every port of the primitive)."""
    bits = {"A": 18, "B": 18, "C": 18}
    ports = [f"{p}{n}" for p, width in bits.items() for n in range(width)]
    ports += ["SIGNEDA", "SIGNEDB", "SOURCEA", "SOURCEB"]
    ports += [f"{s}{n}" for s in ("CLK", "CE", "RST") for n in range(4)]
    outputs = [f"P{n}" for n in range(36)]
    params = ["REG_INPUTA_CLK", "REG_INPUTA_CE", "REG_INPUTA_RST", "REG_INPUTB_CLK", "REG_INPUTB_CE",
              "REG_INPUTB_RST", "REG_OUTPUT_CLK", "REG_OUTPUT_CE", "REG_OUTPUT_RST", "RESETMODE"]
    lines = ["/* verilator lint_off UNUSEDSIGNAL */", "module MULT18X18D #("]
    lines.append(",\n".join(f'  parameter {p} = "NONE"' for p in params))
    lines.append(") (")
    lines.append(",\n".join([f"  input {p}" for p in ports] + [f"  output {p}" for p in outputs]))
    lines.append(");")
    lines.append(_MODEL_BODY.rstrip("\n"))
    lines += [f"  assign P{n} = rp[{n}];" for n in range(36)]
    lines.append("endmodule")
    return "\n".join(lines) + "\n"


def trellis_ff_model() -> str:
    """A behavioural model of the Lattice TRELLIS_FF in the modes hw/dsp.py uses (clock on CLK,
    GSR off, LSR a synchronous set or reset with priority over CE; CE used or always enabled);
    any other mode stops the simulation."""
    return """\
/* verilator lint_off UNUSEDSIGNAL */
module TRELLIS_FF #(
  parameter GSR = "ENABLED", parameter CEMUX = "1", parameter CLKMUX = "CLK",
  parameter LSRMUX = "LSR", parameter REGSET = "RESET", parameter SRMODE = "LSR_OVER_CE"
) (input CLK, input LSR, input CE, input DI, input M, output reg Q);
  initial begin
    if (GSR != "DISABLED" || (CEMUX != "1" && CEMUX != "CE") || CLKMUX != "CLK" || LSRMUX != "LSR" ||
        (REGSET != "SET" && REGSET != "RESET") || SRMODE != "LSR_OVER_CE")
      $fatal(1, "TRELLIS_FF model: unsupported mode");
    Q = REGSET == "SET";
  end
  always @(posedge CLK)
    if (LSR) Q <= REGSET == "SET";
    else if (CEMUX == "1" || CE) Q <= DI;
endmodule
"""
