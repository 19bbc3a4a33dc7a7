// Simulation top of the RTL runner: the accelerator (`systolic_top`) and its DRAM, in `sim_core`;
// `sim_top` (after it) wraps it for Verilator; `sim_slice` (last) is a register slice.
//
// The clock is generated here (`always #HALF_PERIOD_NS`, built with Verilator --timing) and reset
// is driven here, so that Verilator runs the cycles itself: cocotb only writes CSRs at the start,
// then sleeps on `irq` or a timer, and reads CSRs and dumps DRAM at the end. No Python runs per
// bus beat.
//
// No port of sim_top reaches the design through combinational logic: the design runs on the
// internal clk_i and rst_i (the ports clk, rst and cycle are copies), the CSR port passes through
// register slices and the DRAM controls are registered. Verilator re-evaluates the logic fed by a
// top-level port (or by any signal visible to cocotb) at every time step; when that logic reaches
// the accelerator, it is half of the run time.
//
// `restart` (registered like the DRAM controls) resets the whole core again, the accelerator and
// the DRAM model's queues (not its contents), for RESET_CYCLES cycles: the runner's batch mode
// starts every job from reset, so that a hung or failed job leaves nothing behind.
//
// DRAM (EXT_MEM = 0) is `axi_ram`: back-door load and dump, optional pseudo-random backpressure.
// With EXT_MEM = 1 the accelerator's AXI4 port is the m_axi_* ports instead, served from cocotb
// (cocotbext-axi's AxiRam) for protocol robustness runs, and the clock is the clk_ext input,
// driven by cocotb: cocotb then samples the bus before each rising edge, as cocotbext-axi expects
// (after an edge of a clock made in the HDL, cocotb already reads the updated registers).
//
// Units: addresses and sizes in bytes, time in ns, latencies in clock cycles.

`timescale 1ns / 1ps

module sim_core #(
    parameter int     DATA_WIDTH     = 64,             // AXI4 data width of the accelerator, bits
    parameter longint MEM_BYTES      = 64'd1 << 24,    // DRAM capacity, bytes (power of two)
    parameter int     READ_LATENCY   = 16,             // DRAM read latency, cycles (>= 2)
    parameter int     MAX_READS      = 16,             // read bursts the DRAM queues
    parameter int     MAX_WRITES     = 16,             // write bursts the DRAM queues
    parameter int     RESET_CYCLES   = 4,              // cycles rst is held high at time 0 (< 256)
    parameter int     HALF_PERIOD_NS = 5,              // half the clock period, ns
    parameter bit     EXT_MEM        = 1'b0            // 1: DRAM and clock come from cocotb
) (
    output logic                    clk,               // the clock of the design
    input  logic                    clk_ext,           // the clock when EXT_MEM
    output logic                    rst,
    output logic [63:0]             cycle,             // cycles since reset was released
    input  logic                    restart,           // reset the core again, taken one cycle late

    // CSR port of the accelerator, driven by cocotb
    input  logic                    s_axil_awvalid,
    output logic                    s_axil_awready,
    input  logic [7:0]              s_axil_awaddr,
    input  logic                    s_axil_wvalid,
    output logic                    s_axil_wready,
    input  logic [31:0]             s_axil_wdata,
    input  logic [3:0]              s_axil_wstrb,
    output logic                    s_axil_bvalid,
    input  logic                    s_axil_bready,
    output logic [1:0]              s_axil_bresp,
    input  logic                    s_axil_arvalid,
    output logic                    s_axil_arready,
    input  logic [7:0]              s_axil_araddr,
    output logic                    s_axil_rvalid,
    input  logic                    s_axil_rready,
    output logic [31:0]             s_axil_rdata,
    output logic [1:0]              s_axil_rresp,
    output logic                    irq,

    // DRAM controls (see axi_ram.sv), taken one cycle late; unused with EXT_MEM
    input  logic                    random_en,
    input  logic [63:0]             random_seed,
    input  logic [63:0]             err_lo,
    input  logic [63:0]             err_hi,
    input  logic [63:0]             limit_bytes,
    input  logic                    dram_load,
    input  logic                    dram_dump,
    input  logic [63:0]             dump_bytes,

    // the accelerator's AXI4 manager port, for an external DRAM model when EXT_MEM (else idle)
    output logic                    m_axi_awvalid,
    input  logic                    m_axi_awready,
    output logic [0:0]              m_axi_awid,
    output logic [31:0]             m_axi_awaddr,
    output logic [7:0]              m_axi_awlen,
    output logic [2:0]              m_axi_awsize,
    output logic [1:0]              m_axi_awburst,
    output logic                    m_axi_wvalid,
    input  logic                    m_axi_wready,
    output logic [DATA_WIDTH-1:0]   m_axi_wdata,
    output logic [DATA_WIDTH/8-1:0] m_axi_wstrb,
    output logic                    m_axi_wlast,
    input  logic                    m_axi_bvalid,
    output logic                    m_axi_bready,
    input  logic [0:0]              m_axi_bid,
    input  logic [1:0]              m_axi_bresp,
    output logic                    m_axi_arvalid,
    input  logic                    m_axi_arready,
    output logic [0:0]              m_axi_arid,
    output logic [31:0]             m_axi_araddr,
    output logic [7:0]              m_axi_arlen,
    output logic [2:0]              m_axi_arsize,
    output logic [1:0]              m_axi_arburst,
    input  logic                    m_axi_rvalid,
    output logic                    m_axi_rready,
    input  logic [0:0]              m_axi_rid,
    input  logic [DATA_WIDTH-1:0]   m_axi_rdata,
    input  logic [1:0]              m_axi_rresp,
    input  logic                    m_axi_rlast
);
    // -- clock, reset, cycle counter --------------------------------------------------------------
    // The design runs on clk_i and rst_i; the ports clk, rst and cycle are copies for cocotb.
    logic        clk_i, rst_i;
    logic [63:0] cycle_i;
    if (EXT_MEM) begin : g_clk_ext
        assign clk_i = clk_ext;
    end else begin : g_clk_int
        initial clk_i = 1'b0;
        always #(HALF_PERIOD_NS) clk_i = ~clk_i;
    end

    logic [7:0] reset_count = 8'd0;     // rst is high for the first RESET_CYCLES cycles
    logic       restart_q = 1'b0;       // and again for RESET_CYCLES cycles after a restart
    always_ff @(posedge clk_i) begin
        restart_q <= restart;
        if (restart_q) reset_count <= 8'd0;
        else if (reset_count != 8'(RESET_CYCLES)) reset_count <= reset_count + 8'd1;
    end
    assign rst_i = reset_count != 8'(RESET_CYCLES);

    always_ff @(posedge clk_i) begin
        if (rst_i) cycle_i <= 64'd0;
        else cycle_i <= cycle_i + 64'd1;
    end
    assign clk = clk_i;
    assign rst = rst_i;
    assign cycle = cycle_i;

    // -- CSR port: a register slice per channel, so that cocotb's inputs reach the accelerator
    //    only through registers -----------------------------------------------------------------
    logic        csr_awvalid, csr_awready, csr_wvalid, csr_wready, csr_bvalid, csr_bready;
    logic        csr_arvalid, csr_arready, csr_rvalid, csr_rready;
    logic [7:0]  csr_awaddr, csr_araddr;
    logic [31:0] csr_wdata, csr_rdata;
    logic [3:0]  csr_wstrb;
    logic [1:0]  csr_bresp, csr_rresp;

    sim_slice #(.WIDTH(8)) slice_aw (
        .clk(clk_i), .rst(rst_i),
        .in_valid(s_axil_awvalid), .in_ready(s_axil_awready), .in_data(s_axil_awaddr),
        .out_valid(csr_awvalid), .out_ready(csr_awready), .out_data(csr_awaddr));
    sim_slice #(.WIDTH(36)) slice_w (
        .clk(clk_i), .rst(rst_i),
        .in_valid(s_axil_wvalid), .in_ready(s_axil_wready), .in_data({s_axil_wstrb, s_axil_wdata}),
        .out_valid(csr_wvalid), .out_ready(csr_wready), .out_data({csr_wstrb, csr_wdata}));
    sim_slice #(.WIDTH(2)) slice_b (
        .clk(clk_i), .rst(rst_i),
        .in_valid(csr_bvalid), .in_ready(csr_bready), .in_data(csr_bresp),
        .out_valid(s_axil_bvalid), .out_ready(s_axil_bready), .out_data(s_axil_bresp));
    sim_slice #(.WIDTH(8)) slice_ar (
        .clk(clk_i), .rst(rst_i),
        .in_valid(s_axil_arvalid), .in_ready(s_axil_arready), .in_data(s_axil_araddr),
        .out_valid(csr_arvalid), .out_ready(csr_arready), .out_data(csr_araddr));
    sim_slice #(.WIDTH(34)) slice_r (
        .clk(clk_i), .rst(rst_i),
        .in_valid(csr_rvalid), .in_ready(csr_rready), .in_data({csr_rresp, csr_rdata}),
        .out_valid(s_axil_rvalid), .out_ready(s_axil_rready), .out_data({s_axil_rresp, s_axil_rdata}));

    // -- the accelerator's AXI4 port ------------------------------------------------------------
    logic                    awvalid, awready, wvalid, wready, wlast, bvalid, bready;
    logic                    arvalid, arready, rvalid, rready, rlast;
    logic [31:0]             awaddr, araddr;
    logic [7:0]              awlen, arlen;
    logic [2:0]              awsize, arsize;
    logic [1:0]              awburst, arburst, bresp, rresp;
    logic [DATA_WIDTH-1:0]   wdata, rdata;
    logic [DATA_WIDTH/8-1:0] wstrb;

    systolic_top accelerator (
        .clk            (clk_i),
        .rst            (rst_i),
        .m_axi_awvalid  (awvalid),
        .m_axi_awready  (awready),
        .m_axi_awaddr   (awaddr),
        .m_axi_awlen    (awlen),
        .m_axi_awsize   (awsize),
        .m_axi_awburst  (awburst),
        .m_axi_wvalid   (wvalid),
        .m_axi_wready   (wready),
        .m_axi_wdata    (wdata),
        .m_axi_wstrb    (wstrb),
        .m_axi_wlast    (wlast),
        .m_axi_bvalid   (bvalid),
        .m_axi_bready   (bready),
        .m_axi_bresp    (bresp),
        .m_axi_arvalid  (arvalid),
        .m_axi_arready  (arready),
        .m_axi_araddr   (araddr),
        .m_axi_arlen    (arlen),
        .m_axi_arsize   (arsize),
        .m_axi_arburst  (arburst),
        .m_axi_rvalid   (rvalid),
        .m_axi_rready   (rready),
        .m_axi_rdata    (rdata),
        .m_axi_rresp    (rresp),
        .m_axi_rlast    (rlast),
        .s_axil_awvalid (csr_awvalid),
        .s_axil_awready (csr_awready),
        .s_axil_awaddr  (csr_awaddr),
        .s_axil_wvalid  (csr_wvalid),
        .s_axil_wready  (csr_wready),
        .s_axil_wdata   (csr_wdata),
        .s_axil_wstrb   (csr_wstrb),
        .s_axil_bvalid  (csr_bvalid),
        .s_axil_bready  (csr_bready),
        .s_axil_bresp   (csr_bresp),
        .s_axil_arvalid (csr_arvalid),
        .s_axil_arready (csr_arready),
        .s_axil_araddr  (csr_araddr),
        .s_axil_rvalid  (csr_rvalid),
        .s_axil_rready  (csr_rready),
        .s_axil_rdata   (csr_rdata),
        .s_axil_rresp   (csr_rresp),
        .irq            (irq)
    );

    // -- DRAM: the internal RAM, or the m_axi_* ports ----------------------------------------------
    if (EXT_MEM) begin : g_ext_mem
        assign m_axi_awvalid = awvalid;
        assign awready       = m_axi_awready;
        assign m_axi_awid    = 1'b0;
        assign m_axi_awaddr  = awaddr;
        assign m_axi_awlen   = awlen;
        assign m_axi_awsize  = awsize;
        assign m_axi_awburst = awburst;
        assign m_axi_wvalid  = wvalid;
        assign wready        = m_axi_wready;
        assign m_axi_wdata   = wdata;
        assign m_axi_wstrb   = wstrb;
        assign m_axi_wlast   = wlast;
        assign bvalid        = m_axi_bvalid;
        assign m_axi_bready  = bready;
        assign bresp         = m_axi_bresp;
        assign m_axi_arvalid = arvalid;
        assign arready       = m_axi_arready;
        assign m_axi_arid    = 1'b0;
        assign m_axi_araddr  = araddr;
        assign m_axi_arlen   = arlen;
        assign m_axi_arsize  = arsize;
        assign m_axi_arburst = arburst;
        assign rvalid        = m_axi_rvalid;
        assign m_axi_rready  = rready;
        assign rdata         = m_axi_rdata;
        assign rresp         = m_axi_rresp;
        assign rlast         = m_axi_rlast;
    end else begin : g_axi_ram
        // the controls, registered: see the header
        logic        random_en_q, load_q, dump_q;
        logic [63:0] random_seed_q, err_lo_q, err_hi_q, limit_q, dump_bytes_q;
        logic [0:0]  bid, rid;
        logic [7:0]  reads_in_flight;

        always_ff @(posedge clk_i) begin
            random_en_q <= random_en;
            random_seed_q <= random_seed;
            err_lo_q <= err_lo;
            err_hi_q <= err_hi;
            limit_q <= limit_bytes;
            load_q <= dram_load;
            dump_q <= dram_dump;
            dump_bytes_q <= dump_bytes;
        end

        axi_ram #(
            .DATA_WIDTH   (DATA_WIDTH),
            .ADDR_WIDTH   (32),
            .ID_WIDTH     (1),
            .MEM_BYTES    (MEM_BYTES),
            .READ_LATENCY (READ_LATENCY),
            .MAX_READS    (MAX_READS),
            .MAX_WRITES   (MAX_WRITES)
        ) dram (
            .clk             (clk_i),
            .rst             (rst_i),
            .s_axi_awvalid   (awvalid),
            .s_axi_awready   (awready),
            .s_axi_awid      (1'b0),
            .s_axi_awaddr    (awaddr),
            .s_axi_awlen     (awlen),
            .s_axi_awsize    (awsize),
            .s_axi_awburst   (awburst),
            .s_axi_wvalid    (wvalid),
            .s_axi_wready    (wready),
            .s_axi_wdata     (wdata),
            .s_axi_wstrb     (wstrb),
            .s_axi_wlast     (wlast),
            .s_axi_bvalid    (bvalid),
            .s_axi_bready    (bready),
            .s_axi_bid       (bid),
            .s_axi_bresp     (bresp),
            .s_axi_arvalid   (arvalid),
            .s_axi_arready   (arready),
            .s_axi_arid      (1'b0),
            .s_axi_araddr    (araddr),
            .s_axi_arlen     (arlen),
            .s_axi_arsize    (arsize),
            .s_axi_arburst   (arburst),
            .s_axi_rvalid    (rvalid),
            .s_axi_rready    (rready),
            .s_axi_rid       (rid),
            .s_axi_rdata     (rdata),
            .s_axi_rresp     (rresp),
            .s_axi_rlast     (rlast),
            .random_en       (random_en_q),
            .random_seed     (random_seed_q),
            .err_lo          (err_lo_q),
            .err_hi          (err_hi_q),
            .limit_bytes     (limit_q),
            .load            (load_q),
            .dump            (dump_q),
            .dump_bytes      (dump_bytes_q),
            .reads_in_flight (reads_in_flight)
        );

        assign {m_axi_awvalid, m_axi_awid, m_axi_awaddr, m_axi_awlen, m_axi_awsize, m_axi_awburst} = '0;
        assign {m_axi_wvalid, m_axi_wdata, m_axi_wstrb, m_axi_wlast, m_axi_bready} = '0;
        assign {m_axi_arvalid, m_axi_arid, m_axi_araddr, m_axi_arlen, m_axi_arsize, m_axi_arburst} = '0;
        assign m_axi_rready = 1'b0;
    end
endmodule


// The top for Verilator: sim_core with nothing but its ports. The build makes the signals of the
// top module visible to cocotb (--public-depth 1) and no others: see the header.
module sim_top #(
    parameter int     DATA_WIDTH     = 64,             // AXI4 data width of the accelerator, bits
    parameter longint MEM_BYTES      = 64'd1 << 24,    // DRAM capacity, bytes (power of two)
    parameter int     READ_LATENCY   = 16,             // DRAM read latency, cycles (>= 2)
    parameter int     MAX_READS      = 16,             // read bursts the DRAM queues
    parameter int     MAX_WRITES     = 16,             // write bursts the DRAM queues
    parameter int     RESET_CYCLES   = 4,              // cycles rst is held high at time 0 (< 256)
    parameter int     HALF_PERIOD_NS = 5,              // half the clock period, ns
    parameter bit     EXT_MEM        = 1'b0            // 1: DRAM and clock come from cocotb
) (
    output logic                    clk,               // the clock of the design
    input  logic                    clk_ext,           // the clock when EXT_MEM
    output logic                    rst,
    output logic [63:0]             cycle,             // cycles since reset was released
    input  logic                    restart,           // reset the core again, taken one cycle late

    // CSR port of the accelerator, driven by cocotb
    input  logic                    s_axil_awvalid,
    output logic                    s_axil_awready,
    input  logic [7:0]              s_axil_awaddr,
    input  logic                    s_axil_wvalid,
    output logic                    s_axil_wready,
    input  logic [31:0]             s_axil_wdata,
    input  logic [3:0]              s_axil_wstrb,
    output logic                    s_axil_bvalid,
    input  logic                    s_axil_bready,
    output logic [1:0]              s_axil_bresp,
    input  logic                    s_axil_arvalid,
    output logic                    s_axil_arready,
    input  logic [7:0]              s_axil_araddr,
    output logic                    s_axil_rvalid,
    input  logic                    s_axil_rready,
    output logic [31:0]             s_axil_rdata,
    output logic [1:0]              s_axil_rresp,
    output logic                    irq,

    // DRAM controls (see axi_ram.sv), taken one cycle late; unused with EXT_MEM
    input  logic                    random_en,
    input  logic [63:0]             random_seed,
    input  logic [63:0]             err_lo,
    input  logic [63:0]             err_hi,
    input  logic [63:0]             limit_bytes,
    input  logic                    dram_load,
    input  logic                    dram_dump,
    input  logic [63:0]             dump_bytes,

    // the accelerator's AXI4 manager port, for an external DRAM model when EXT_MEM (else idle)
    output logic                    m_axi_awvalid,
    input  logic                    m_axi_awready,
    output logic [0:0]              m_axi_awid,
    output logic [31:0]             m_axi_awaddr,
    output logic [7:0]              m_axi_awlen,
    output logic [2:0]              m_axi_awsize,
    output logic [1:0]              m_axi_awburst,
    output logic                    m_axi_wvalid,
    input  logic                    m_axi_wready,
    output logic [DATA_WIDTH-1:0]   m_axi_wdata,
    output logic [DATA_WIDTH/8-1:0] m_axi_wstrb,
    output logic                    m_axi_wlast,
    input  logic                    m_axi_bvalid,
    output logic                    m_axi_bready,
    input  logic [0:0]              m_axi_bid,
    input  logic [1:0]              m_axi_bresp,
    output logic                    m_axi_arvalid,
    input  logic                    m_axi_arready,
    output logic [0:0]              m_axi_arid,
    output logic [31:0]             m_axi_araddr,
    output logic [7:0]              m_axi_arlen,
    output logic [2:0]              m_axi_arsize,
    output logic [1:0]              m_axi_arburst,
    input  logic                    m_axi_rvalid,
    output logic                    m_axi_rready,
    input  logic [0:0]              m_axi_rid,
    input  logic [DATA_WIDTH-1:0]   m_axi_rdata,
    input  logic [1:0]              m_axi_rresp,
    input  logic                    m_axi_rlast
);
    sim_core #(
        .DATA_WIDTH     (DATA_WIDTH),
        .MEM_BYTES      (MEM_BYTES),
        .READ_LATENCY   (READ_LATENCY),
        .MAX_READS      (MAX_READS),
        .MAX_WRITES     (MAX_WRITES),
        .RESET_CYCLES   (RESET_CYCLES),
        .HALF_PERIOD_NS (HALF_PERIOD_NS),
        .EXT_MEM        (EXT_MEM)
    ) core (.*);
endmodule


// A register slice of one valid/ready channel (a two-entry skid buffer): every output is a
// register, so that one side's signals reach the other side only through registers; full
// throughput, in order.
module sim_slice #(
    parameter int WIDTH = 1
) (
    input  logic             clk,
    input  logic             rst,
    input  logic             in_valid,
    output logic             in_ready,
    input  logic [WIDTH-1:0] in_data,
    output logic             out_valid,
    input  logic             out_ready,
    output logic [WIDTH-1:0] out_data
);
    logic             skid_full;
    logic [WIDTH-1:0] skid_data;

    assign in_ready = !skid_full;

    always_ff @(posedge clk) begin
        if (rst) begin
            out_valid <= 1'b0;
            skid_full <= 1'b0;
        end else if (out_valid && !out_ready) begin
            // the output waits: an accepted input waits in the skid register
            if (in_valid && !skid_full) begin
                skid_full <= 1'b1;
                skid_data <= in_data;
            end
        end else if (skid_full) begin
            out_valid <= 1'b1;
            out_data <= skid_data;
            skid_full <= 1'b0;
        end else begin
            out_valid <= in_valid;
            out_data <= in_data;
        end
    end
endmodule
