// AXI4 subordinate RAM for simulation: the DRAM behind the accelerator in RTL runs.
//
// * INCR bursts of any length (1..256 beats) and any beat size up to the bus width; the first
//   beat may be unaligned. FIXED and WRAP bursts and beats wider than the bus answer SLVERR.
// * Several outstanding reads: MAX_READS bursts wait in a queue while one is answered; responses
//   come back in order (IDs are echoed). The first beat of a burst leaves READ_LATENCY cycles after
//   its AR handshake at the earliest (READ_LATENCY >= 2), so consecutive bursts overlap their
//   latency like a pipelined DRAM.
// * Writes: MAX_WRITES bursts accepted on AW; W beats are taken once their burst's AW has been
//   accepted; one B response per burst after its last beat.
// * random_en: pseudo-random backpressure on AR, AW and W, gaps between R beats, delayed B and
//   0..15 extra cycles of read latency, from a xorshift64 generator (a linear feedback shift
//   register) seeded with random_seed during reset.
// * Error injection: a beat whose bus word (its address rounded down to the bus width) lies in
//   [err_lo, err_hi) answers SLVERR; at or past limit_bytes (0: MEM_BYTES) it answers DECERR.
//   Erroring reads return zero data, erroring write beats are dropped, and a write burst's
//   B response is the worst of its beats (DECERR > SLVERR > OKAY).
// * Back door: while `load` is high at a clock edge the memory is read from the load file with
//   $readmemh; while `dump` is high the first dump_bytes bytes (whole words; 0: all) are written
//   to the dump file with $writememh. One bus word per line, most significant byte first, so
//   byte address a is byte (a mod (DATA_WIDTH/8)) of word a / (DATA_WIDTH/8). The file names are
//   the plusargs +dram_load=<path> and +dram_dump=<path>, else LOAD_FILE and DUMP_FILE (relative
//   to the simulator's working directory).
//
// Units: addresses and sizes in bytes, latencies in clock cycles.

`timescale 1ns / 1ps

module axi_ram #(
    parameter int     DATA_WIDTH   = 64,                // bits per beat: 32, 64 or 128
    parameter int     ADDR_WIDTH   = 32,                // bits of byte address
    parameter int     ID_WIDTH     = 1,                 // bits of AXI ID
    parameter longint MEM_BYTES    = 64'd1 << 20,       // capacity, bytes (power of two)
    parameter int     READ_LATENCY = 2,                 // cycles from AR handshake to the first R beat
    parameter int     MAX_READS    = 8,                 // read bursts queued (power of two >= 2)
    parameter int     MAX_WRITES   = 8,                 // write bursts queued (power of two >= 2)
    parameter string  LOAD_FILE    = "dram_load.hex",
    parameter string  DUMP_FILE    = "dram_dump.hex"
) (
    input  logic                    clk,
    input  logic                    rst,                // synchronous, active high

    input  logic                    s_axi_awvalid,
    output logic                    s_axi_awready,
    input  logic [ID_WIDTH-1:0]     s_axi_awid,
    input  logic [ADDR_WIDTH-1:0]   s_axi_awaddr,
    input  logic [7:0]              s_axi_awlen,
    input  logic [2:0]              s_axi_awsize,
    input  logic [1:0]              s_axi_awburst,
    input  logic                    s_axi_wvalid,
    output logic                    s_axi_wready,
    input  logic [DATA_WIDTH-1:0]   s_axi_wdata,
    input  logic [DATA_WIDTH/8-1:0] s_axi_wstrb,
    input  logic                    s_axi_wlast,
    output logic                    s_axi_bvalid,
    input  logic                    s_axi_bready,
    output logic [ID_WIDTH-1:0]     s_axi_bid,
    output logic [1:0]              s_axi_bresp,
    input  logic                    s_axi_arvalid,
    output logic                    s_axi_arready,
    input  logic [ID_WIDTH-1:0]     s_axi_arid,
    input  logic [ADDR_WIDTH-1:0]   s_axi_araddr,
    input  logic [7:0]              s_axi_arlen,
    input  logic [2:0]              s_axi_arsize,
    input  logic [1:0]              s_axi_arburst,
    output logic                    s_axi_rvalid,
    input  logic                    s_axi_rready,
    output logic [ID_WIDTH-1:0]     s_axi_rid,
    output logic [DATA_WIDTH-1:0]   s_axi_rdata,
    output logic [1:0]              s_axi_rresp,
    output logic                    s_axi_rlast,

    input  logic                    random_en,          // pseudo-random backpressure and latency
    input  logic [63:0]             random_seed,        // sampled during reset; 0 picks a fixed seed
    input  logic [63:0]             err_lo,             // SLVERR range [err_lo, err_hi), bytes
    input  logic [63:0]             err_hi,
    input  logic [63:0]             limit_bytes,        // DECERR at or past this address; 0: MEM_BYTES
    input  logic                    load,               // back door: $readmemh at this edge
    input  logic                    dump,               // back door: $writememh at this edge
    input  logic [63:0]             dump_bytes,         // bytes dumped from address 0; 0: all
    output logic [7:0]              reads_in_flight     // read bursts accepted, last beat not yet issued
);
    localparam int BYTES = DATA_WIDTH / 8;
    localparam longint BYTES_L = 64'(BYTES);
    localparam int LANE_BITS = $clog2(BYTES);
    localparam longint WORDS = MEM_BYTES / BYTES_L;
    localparam int INDEX_BITS = $clog2(WORDS);
    localparam int RQ_BITS = $clog2(MAX_READS);
    localparam int WQ_BITS = $clog2(MAX_WRITES);
    localparam logic [1:0] OKAY = 2'b00, SLVERR = 2'b10, DECERR = 2'b11;
    localparam logic [1:0] BURST_INCR = 2'b01;

    // -- parameter rules (elaboration stops with the message) ---------------------------------
    if (DATA_WIDTH != 32 && DATA_WIDTH != 64 && DATA_WIDTH != 128) begin : g_bad_width
        $fatal(1, "axi_ram: DATA_WIDTH must be 32, 64 or 128, not %0d", DATA_WIDTH);
    end
    if (MEM_BYTES < BYTES_L || (MEM_BYTES & (MEM_BYTES - 1)) != 0 || MEM_BYTES > (64'd1 << ADDR_WIDTH))
    begin : g_bad_size
        $fatal(1, "axi_ram: MEM_BYTES must be a power of two between the bus width and 2**ADDR_WIDTH, not %0d",
               MEM_BYTES);
    end
    if (READ_LATENCY < 2) begin : g_bad_latency
        $fatal(1, "axi_ram: READ_LATENCY must be at least 2 cycles, not %0d", READ_LATENCY);
    end
    if (MAX_READS < 2 || MAX_READS > 128 || (MAX_READS & (MAX_READS - 1)) != 0) begin : g_bad_reads
        $fatal(1, "axi_ram: MAX_READS must be a power of two between 2 and 128, not %0d", MAX_READS);
    end
    if (MAX_WRITES < 2 || (MAX_WRITES & (MAX_WRITES - 1)) != 0) begin : g_bad_writes
        $fatal(1, "axi_ram: MAX_WRITES must be a power of two of at least 2, not %0d", MAX_WRITES);
    end

    logic [DATA_WIDTH-1:0] mem [WORDS];

    // -- time, pseudo-random stalls ------------------------------------------------------------
    logic [63:0] now;           // cycles since reset
    logic [63:0] rng;

    function automatic logic [63:0] xorshift64(input logic [63:0] s);
        logic [63:0] x;
        x = s;
        x = x ^ (x << 13);
        x = x ^ (x >> 7);
        x = x ^ (x << 17);
        return x;
    endfunction

    wire stall_ar = random_en && rng[1:0] == 2'b00;       // each about one cycle in four
    wire stall_r  = random_en && rng[3:2] == 2'b00;
    wire stall_aw = random_en && rng[5:4] == 2'b00;
    wire stall_w  = random_en && rng[7:6] == 2'b00;
    wire stall_b  = random_en && rng[9:8] == 2'b00;
    wire [63:0] extra_latency = random_en ? 64'(rng[19:16]) : 64'd0;

    wire [63:0] limit = (limit_bytes == 64'd0 || limit_bytes > MEM_BYTES) ? MEM_BYTES : limit_bytes;

    // Response of one beat at byte address `addr` of a burst that is `bad` (FIXED/WRAP or too wide).
    function automatic logic [1:0] beat_resp(input logic [ADDR_WIDTH-1:0] addr, input logic bad,
                                             input logic [63:0] lim, input logic [63:0] lo,
                                             input logic [63:0] hi);
        logic [63:0] word;
        word = 64'(addr) & ~64'(BYTES - 1);
        if (word >= lim) return DECERR;
        if (bad || (word >= lo && word < hi)) return SLVERR;
        return OKAY;
    endfunction

    // Address of the beat after the one at `addr` in an INCR burst of 2**size-byte beats.
    function automatic logic [ADDR_WIDTH-1:0] next_beat(input logic [ADDR_WIDTH-1:0] addr,
                                                        input logic [2:0] size);
        logic [ADDR_WIDTH-1:0] step;
        step = ADDR_WIDTH'(1) << size;
        return (addr & ~(step - ADDR_WIDTH'(1))) + step;
    endfunction

    function automatic logic [INDEX_BITS-1:0] word_index(input logic [ADDR_WIDTH-1:0] addr);
        return INDEX_BITS'(addr >> LANE_BITS);
    endfunction

    function automatic logic bad_burst(input logic [1:0] burst, input logic [2:0] size);
        return burst != BURST_INCR || 32'(size) > LANE_BITS;
    endfunction

    function automatic logic [1:0] worst(input logic [1:0] a, input logic [1:0] b);
        return a > b ? a : b;
    endfunction

    // -- read side: request queue, the burst being answered, R register -----------------------
    logic [ADDR_WIDTH-1:0] rq_addr [MAX_READS];
    logic [7:0]            rq_len  [MAX_READS];
    logic [2:0]            rq_size [MAX_READS];
    logic                  rq_bad  [MAX_READS];
    logic [ID_WIDTH-1:0]   rq_id   [MAX_READS];
    logic [63:0]           rq_due  [MAX_READS];    // first cycle the first beat may be issued
    logic [RQ_BITS-1:0]    rq_head, rq_tail;
    logic [RQ_BITS:0]      rq_count;

    logic                  rd_active;              // a burst has beats left to issue
    logic [ADDR_WIDTH-1:0] rd_addr;
    logic [7:0]            rd_left;                // beats left after the next one
    logic [2:0]            rd_size;
    logic                  rd_bad;
    logic [ID_WIDTH-1:0]   rd_id;

    // the next beat to issue: from the active burst, or the first beat of the queue head
    wire                   head_due = rq_count != 0 && now >= rq_due[rq_head];
    wire                   rb_avail = rd_active || head_due;
    wire [ADDR_WIDTH-1:0]  rb_addr  = rd_active ? rd_addr : rq_addr[rq_head];
    wire [7:0]             rb_left  = rd_active ? rd_left : rq_len[rq_head];
    wire [2:0]             rb_size  = rd_active ? rd_size : rq_size[rq_head];
    wire                   rb_bad   = rd_active ? rd_bad  : rq_bad[rq_head];
    wire [ID_WIDTH-1:0]    rb_id    = rd_active ? rd_id   : rq_id[rq_head];
    wire [1:0]             rb_resp  = beat_resp(rb_addr, rb_bad, limit, err_lo, err_hi);

    wire r_free  = !s_axi_rvalid || s_axi_rready;
    wire r_issue = r_free && rb_avail && !stall_r;
    wire ar_take = s_axi_arvalid && s_axi_arready;
    wire rq_pop  = r_issue && !rd_active;

    assign s_axi_arready = rq_count != (RQ_BITS + 1)'(MAX_READS) && !stall_ar;
    assign reads_in_flight = 8'(rq_count) + 8'(rd_active);

    // -- write side: AW queue, the burst being written, B queue ---------------------------------
    logic [ADDR_WIDTH-1:0] wq_addr [MAX_WRITES];
    logic [7:0]            wq_len  [MAX_WRITES];
    logic [2:0]            wq_size [MAX_WRITES];
    logic                  wq_bad  [MAX_WRITES];
    logic [ID_WIDTH-1:0]   wq_id   [MAX_WRITES];
    logic [WQ_BITS-1:0]    wq_head, wq_tail;
    logic [WQ_BITS:0]      wq_count;

    logic                  wr_active;
    logic [ADDR_WIDTH-1:0] wr_addr;
    logic [7:0]            wr_left;
    logic [2:0]            wr_size;
    logic                  wr_bad;
    logic [ID_WIDTH-1:0]   wr_id;
    logic [1:0]            wr_resp;                // worst response of the burst's beats so far

    logic [ID_WIDTH-1:0]   bq_id   [MAX_WRITES];
    logic [1:0]            bq_resp [MAX_WRITES];
    logic [WQ_BITS-1:0]    bq_head, bq_tail;
    logic [WQ_BITS:0]      bq_count;
    logic                  b_hold;                 // B was offered and not taken: keep it valid

    wire                   wb_avail = wr_active || wq_count != 0;
    wire [ADDR_WIDTH-1:0]  wb_addr  = wr_active ? wr_addr : wq_addr[wq_head];
    wire [7:0]             wb_left  = wr_active ? wr_left : wq_len[wq_head];
    wire [2:0]             wb_size  = wr_active ? wr_size : wq_size[wq_head];
    wire                   wb_bad   = wr_active ? wr_bad  : wq_bad[wq_head];
    wire [ID_WIDTH-1:0]    wb_id    = wr_active ? wr_id   : wq_id[wq_head];
    wire [1:0]             wb_prev  = wr_active ? wr_resp : OKAY;
    wire [1:0]             wb_resp  = beat_resp(wb_addr, wb_bad, limit, err_lo, err_hi);
    // a wlast that disagrees with awlen is a manager error: the burst answers SLVERR
    wire [1:0]             wb_total = worst(worst(wb_prev, wb_resp),
                                            (s_axi_wlast != (wb_left == 8'd0)) ? SLVERR : OKAY);

    wire aw_take = s_axi_awvalid && s_axi_awready;
    wire w_take  = s_axi_wvalid && s_axi_wready;
    wire w_done  = w_take && wb_left == 8'd0;
    wire wq_pop  = w_take && !wr_active;
    wire b_take  = s_axi_bvalid && s_axi_bready;

    assign s_axi_awready = wq_count != (WQ_BITS + 1)'(MAX_WRITES) && !stall_aw;
    assign s_axi_wready  = wb_avail && bq_count != (WQ_BITS + 1)'(MAX_WRITES) && !stall_w;
    assign s_axi_bvalid  = bq_count != 0 && (b_hold || !stall_b);
    assign s_axi_bid     = bq_id[bq_head];
    assign s_axi_bresp   = bq_resp[bq_head];

    // -- back door --------------------------------------------------------------------------
    string load_path, dump_path;
    initial begin
        if (!$value$plusargs("dram_load=%s", load_path)) load_path = LOAD_FILE;
        if (!$value$plusargs("dram_dump=%s", dump_path)) dump_path = DUMP_FILE;
    end

    wire [63:0] dump_words = (dump_bytes == 64'd0 || dump_bytes > MEM_BYTES)
                             ? 64'(WORDS) : (dump_bytes + 64'(BYTES - 1)) >> LANE_BITS;

    // -- one process for every write to `mem` (AXI writes and the back door) --------------------
    always_ff @(posedge clk) begin
        if (load) $readmemh(load_path, mem);
        if (dump) $writememh(dump_path, mem, 0, INDEX_BITS'(dump_words - 64'd1));

        if (rst) begin
            now <= 64'd0;
            rng <= random_seed == 64'd0 ? 64'h9E37_79B9_7F4A_7C15 : random_seed;
            rq_head <= '0;
            rq_tail <= '0;
            rq_count <= '0;
            rd_active <= 1'b0;
            s_axi_rvalid <= 1'b0;
            s_axi_rlast <= 1'b0;
            wq_head <= '0;
            wq_tail <= '0;
            wq_count <= '0;
            wr_active <= 1'b0;
            bq_head <= '0;
            bq_tail <= '0;
            bq_count <= '0;
            b_hold <= 1'b0;
        end else begin
            now <= now + 64'd1;
            if (random_en) rng <= xorshift64(rng);

            // AR -> request queue
            if (ar_take) begin
                rq_addr[rq_tail] <= s_axi_araddr;
                rq_len[rq_tail] <= s_axi_arlen;
                rq_size[rq_tail] <= s_axi_arsize;
                rq_bad[rq_tail] <= bad_burst(s_axi_arburst, s_axi_arsize);
                rq_id[rq_tail] <= s_axi_arid;
                rq_due[rq_tail] <= now + 64'(READ_LATENCY - 1) + extra_latency;
                rq_tail <= rq_tail + 1'b1;
            end
            rq_count <= rq_count + (RQ_BITS + 1)'(ar_take) - (RQ_BITS + 1)'(rq_pop);

            // R beats
            if (r_issue) begin
                s_axi_rvalid <= 1'b1;
                s_axi_rid <= rb_id;
                s_axi_rresp <= rb_resp;
                s_axi_rlast <= rb_left == 8'd0;
                s_axi_rdata <= rb_resp == OKAY ? mem[word_index(rb_addr)] : '0;
                if (rq_pop) rq_head <= rq_head + 1'b1;
                rd_active <= rb_left != 8'd0;
                rd_addr <= next_beat(rb_addr, rb_size);
                rd_left <= rb_left - 8'd1;
                rd_size <= rb_size;
                rd_bad <= rb_bad;
                rd_id <= rb_id;
            end else if (r_free) begin
                s_axi_rvalid <= 1'b0;
            end

            // AW -> write queue
            if (aw_take) begin
                wq_addr[wq_tail] <= s_axi_awaddr;
                wq_len[wq_tail] <= s_axi_awlen;
                wq_size[wq_tail] <= s_axi_awsize;
                wq_bad[wq_tail] <= bad_burst(s_axi_awburst, s_axi_awsize);
                wq_id[wq_tail] <= s_axi_awid;
                wq_tail <= wq_tail + 1'b1;
            end
            wq_count <= wq_count + (WQ_BITS + 1)'(aw_take) - (WQ_BITS + 1)'(wq_pop);

            // W beats
            if (w_take) begin
                if (wb_resp == OKAY) begin
                    for (int lane = 0; lane < BYTES; lane++) begin
                        if (s_axi_wstrb[lane]) mem[word_index(wb_addr)][lane*8 +: 8] <= s_axi_wdata[lane*8 +: 8];
                    end
                end
                if (wq_pop) wq_head <= wq_head + 1'b1;
                wr_active <= wb_left != 8'd0;
                wr_addr <= next_beat(wb_addr, wb_size);
                wr_left <= wb_left - 8'd1;
                wr_size <= wb_size;
                wr_bad <= wb_bad;
                wr_id <= wb_id;
                wr_resp <= wb_total;
            end

            // B responses
            if (w_done) begin
                bq_id[bq_tail] <= wb_id;
                bq_resp[bq_tail] <= wb_total;
                bq_tail <= bq_tail + 1'b1;
            end
            if (b_take) bq_head <= bq_head + 1'b1;
            bq_count <= bq_count + (WQ_BITS + 1)'(w_done) - (WQ_BITS + 1)'(b_take);
            b_hold <= s_axi_bvalid && !s_axi_bready;
        end
    end
endmodule
