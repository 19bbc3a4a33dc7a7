// Behavioural model of the parts of the Lattice ECP5 DP16KD (16 Kbit true dual-port block RAM)
// that boards/memory.py and hw/bankram.py use, for Verilator: both ports in the 1024 x 18 mode,
// port A reading and writing, port B reading only.
// yosys ships no simulation model of it (its cells_sim_ecp5.v declares an empty module).
//
// From Lattice TN1264 (ECP5 and ECP5-5G Memory Usage Guide) and yosys' mapping of a 1024 x 18
// port (share/lattice/brams_map_16kd.v):
// * the 14-bit address ADA13:0: in the x18 mode the word address is ADA13:4 and ADA1:0 are the
//   write enables of the two 9-bit bytes (DIA8:0 and DIA17:9); ADA3:2 are not used;
// * CEA is the port's clock enable: at a rising CLKA edge with CEA high (and the chip selects
//   CSA2:0 equal to CSDECODE_A) the port writes (WEA high) or reads (WEA low); with CEA low it
//   does nothing and the data latch keeps its value;
// * a write stores the enabled bytes of DIA at the word; WRITEMODE_A "NORMAL": the data latch
//   does not change during a write (WRITETHROUGH and READBEFOREWRITE are not modelled);
// * a read loads the word into the data latch;
// * REGMODE_A "NOREG": DOA is the data latch; "OUTREG": DOA is the output register, which loads
//   the data latch at a rising CLKA edge while OCEA (the output clock enable) is high, so a read's
//   data is on DOA one cycle later than without it. Whether CEA gates the output register too is
//   not verified here: with DP16KD_CE_GATES_OUTREG defined, it loads only while OCEA and CEA are
//   both high (the tests run the memory with both readings);
// * port B reads like port A (ADB13:4, CEB, CSB2:0 against CSDECODE_B, OCEB, REGMODE_B) from the
//   same contents; a read of a word that port A writes at the same edge returns the old word here
//   (undefined on the device: the users of this model never use such a read);
// * the contents start at INITVAL: INITVAL_00 to INITVAL_3F hold 16 words each, word j in bits
//   20j + 17 to 20j (the layout yosys writes; tests/boards/test_bram_multiplier_ecp5.py checks
//   hw/bankram.py's against it), the data latches and the output registers at 0 (after
//   configuration, global set/reset).
// The 512 x 36 pseudo-dual-port mode (DATA_WIDTH_A = DATA_WIDTH_B = 36, as yosys maps a 36-bit
// wide memory, share/lattice/brams_map_16kd.v): port A writes, port B reads, both 36 bits wide.
// * the write: at a rising CLKA edge with CEA and WEA high (and CSA2:0 equal to CSDECODE_A), the
//   word ADA13:5 gets the 9-bit bytes of {DIB17:0, DIA17:0} whose enables ADA3:0 are high (byte k
//   is bits 9k + 8 to 9k); ADA4 is not used;
// * the read: at a rising CLKB edge with CEB high (and CSB2:0 equal to CSDECODE_B), the word
//   ADB13:5 goes into the data latch; the output register loads the latch while OCEB is high (and
//   CEB, with DP16KD_CE_GATES_OUTREG); {DOB17:0, DOA17:0} is the output register with REGMODE
//   "OUTREG", else the latch. Which of REGMODE_A and REGMODE_B governs the output register in
//   this mode is not verified here: the model requires them equal;
// * the contents start at zero (INITVAL is not modelled in this mode: a nonzero one stops).
// RSTA/RSTB (reset of the latch and output register), writes on port B, the other widths and write
// modes are not modelled: using them stops the simulation with $fatal, so that nothing passes by
// accident.
module DP16KD #(
    parameter DATA_WIDTH_A = 18,
    parameter DATA_WIDTH_B = 18,
    parameter REGMODE_A = "NOREG",
    parameter REGMODE_B = "NOREG",
    parameter WRITEMODE_A = "NORMAL",
    parameter WRITEMODE_B = "NORMAL",
    parameter RESETMODE = "SYNC",
    parameter ASYNC_RESET_RELEASE = "SYNC",
    parameter CSDECODE_A = "0b000",
    parameter CSDECODE_B = "0b000",
    parameter CLKAMUX = "CLKA",
    parameter CLKBMUX = "CLKB",
    parameter GSR = "ENABLED",
    parameter [319:0] INITVAL_00 = 320'h0,
    parameter [319:0] INITVAL_01 = 320'h0,
    parameter [319:0] INITVAL_02 = 320'h0,
    parameter [319:0] INITVAL_03 = 320'h0,
    parameter [319:0] INITVAL_04 = 320'h0,
    parameter [319:0] INITVAL_05 = 320'h0,
    parameter [319:0] INITVAL_06 = 320'h0,
    parameter [319:0] INITVAL_07 = 320'h0,
    parameter [319:0] INITVAL_08 = 320'h0,
    parameter [319:0] INITVAL_09 = 320'h0,
    parameter [319:0] INITVAL_0A = 320'h0,
    parameter [319:0] INITVAL_0B = 320'h0,
    parameter [319:0] INITVAL_0C = 320'h0,
    parameter [319:0] INITVAL_0D = 320'h0,
    parameter [319:0] INITVAL_0E = 320'h0,
    parameter [319:0] INITVAL_0F = 320'h0,
    parameter [319:0] INITVAL_10 = 320'h0,
    parameter [319:0] INITVAL_11 = 320'h0,
    parameter [319:0] INITVAL_12 = 320'h0,
    parameter [319:0] INITVAL_13 = 320'h0,
    parameter [319:0] INITVAL_14 = 320'h0,
    parameter [319:0] INITVAL_15 = 320'h0,
    parameter [319:0] INITVAL_16 = 320'h0,
    parameter [319:0] INITVAL_17 = 320'h0,
    parameter [319:0] INITVAL_18 = 320'h0,
    parameter [319:0] INITVAL_19 = 320'h0,
    parameter [319:0] INITVAL_1A = 320'h0,
    parameter [319:0] INITVAL_1B = 320'h0,
    parameter [319:0] INITVAL_1C = 320'h0,
    parameter [319:0] INITVAL_1D = 320'h0,
    parameter [319:0] INITVAL_1E = 320'h0,
    parameter [319:0] INITVAL_1F = 320'h0,
    parameter [319:0] INITVAL_20 = 320'h0,
    parameter [319:0] INITVAL_21 = 320'h0,
    parameter [319:0] INITVAL_22 = 320'h0,
    parameter [319:0] INITVAL_23 = 320'h0,
    parameter [319:0] INITVAL_24 = 320'h0,
    parameter [319:0] INITVAL_25 = 320'h0,
    parameter [319:0] INITVAL_26 = 320'h0,
    parameter [319:0] INITVAL_27 = 320'h0,
    parameter [319:0] INITVAL_28 = 320'h0,
    parameter [319:0] INITVAL_29 = 320'h0,
    parameter [319:0] INITVAL_2A = 320'h0,
    parameter [319:0] INITVAL_2B = 320'h0,
    parameter [319:0] INITVAL_2C = 320'h0,
    parameter [319:0] INITVAL_2D = 320'h0,
    parameter [319:0] INITVAL_2E = 320'h0,
    parameter [319:0] INITVAL_2F = 320'h0,
    parameter [319:0] INITVAL_30 = 320'h0,
    parameter [319:0] INITVAL_31 = 320'h0,
    parameter [319:0] INITVAL_32 = 320'h0,
    parameter [319:0] INITVAL_33 = 320'h0,
    parameter [319:0] INITVAL_34 = 320'h0,
    parameter [319:0] INITVAL_35 = 320'h0,
    parameter [319:0] INITVAL_36 = 320'h0,
    parameter [319:0] INITVAL_37 = 320'h0,
    parameter [319:0] INITVAL_38 = 320'h0,
    parameter [319:0] INITVAL_39 = 320'h0,
    parameter [319:0] INITVAL_3A = 320'h0,
    parameter [319:0] INITVAL_3B = 320'h0,
    parameter [319:0] INITVAL_3C = 320'h0,
    parameter [319:0] INITVAL_3D = 320'h0,
    parameter [319:0] INITVAL_3E = 320'h0,
    parameter [319:0] INITVAL_3F = 320'h0
) (
    input ADA0, ADA1, ADA2, ADA3, ADA4, ADA5, ADA6, ADA7, ADA8, ADA9, ADA10, ADA11, ADA12, ADA13,
    input DIA0, DIA1, DIA2, DIA3, DIA4, DIA5, DIA6, DIA7, DIA8, DIA9, DIA10, DIA11, DIA12, DIA13,
    input DIA14, DIA15, DIA16, DIA17,
    input CLKA, CEA, OCEA, WEA, RSTA, CSA0, CSA1, CSA2,
    output DOA0, DOA1, DOA2, DOA3, DOA4, DOA5, DOA6, DOA7, DOA8, DOA9, DOA10, DOA11, DOA12, DOA13,
    output DOA14, DOA15, DOA16, DOA17,
    input ADB0, ADB1, ADB2, ADB3, ADB4, ADB5, ADB6, ADB7, ADB8, ADB9, ADB10, ADB11, ADB12, ADB13,
    input DIB0, DIB1, DIB2, DIB3, DIB4, DIB5, DIB6, DIB7, DIB8, DIB9, DIB10, DIB11, DIB12, DIB13,
    input DIB14, DIB15, DIB16, DIB17,
    input CLKB, CEB, OCEB, WEB, RSTB, CSB0, CSB1, CSB2,
    output DOB0, DOB1, DOB2, DOB3, DOB4, DOB5, DOB6, DOB7, DOB8, DOB9, DOB10, DOB11, DOB12, DOB13,
    output DOB14, DOB15, DOB16, DOB17
);
    wire [13:0] ada = {ADA13, ADA12, ADA11, ADA10, ADA9, ADA8, ADA7, ADA6, ADA5, ADA4,
                       ADA3, ADA2, ADA1, ADA0};
    wire [17:0] dia = {DIA17, DIA16, DIA15, DIA14, DIA13, DIA12, DIA11, DIA10, DIA9, DIA8,
                       DIA7, DIA6, DIA5, DIA4, DIA3, DIA2, DIA1, DIA0};
    wire [9:0] word = ada[13:4];
    wire [2:0] chip_select = {CSA2, CSA1, CSA0};
    // CSDECODE_A is a string "0bXYZ": its last three characters are the bits
    wire [2:0] decode = {CSDECODE_A[16], CSDECODE_A[8], CSDECODE_A[0]};
    wire [13:0] adb = {ADB13, ADB12, ADB11, ADB10, ADB9, ADB8, ADB7, ADB6, ADB5, ADB4,
                       ADB3, ADB2, ADB1, ADB0};
    wire [9:0] word_b = adb[13:4];
    wire [2:0] chip_select_b = {CSB2, CSB1, CSB0};
    wire [2:0] decode_b = {CSDECODE_B[16], CSDECODE_B[8], CSDECODE_B[0]};
    reg [17:0] latch_b = 18'd0;
    reg [17:0] outreg_b = 18'd0;

    reg [17:0] mem [0:1023];
    reg [17:0] latch = 18'd0;
    reg [17:0] outreg = 18'd0;
    integer i;
    initial begin
        for (i = 0; i < 16; i = i + 1) mem[0 + i] = INITVAL_00[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[16 + i] = INITVAL_01[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[32 + i] = INITVAL_02[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[48 + i] = INITVAL_03[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[64 + i] = INITVAL_04[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[80 + i] = INITVAL_05[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[96 + i] = INITVAL_06[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[112 + i] = INITVAL_07[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[128 + i] = INITVAL_08[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[144 + i] = INITVAL_09[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[160 + i] = INITVAL_0A[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[176 + i] = INITVAL_0B[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[192 + i] = INITVAL_0C[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[208 + i] = INITVAL_0D[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[224 + i] = INITVAL_0E[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[240 + i] = INITVAL_0F[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[256 + i] = INITVAL_10[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[272 + i] = INITVAL_11[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[288 + i] = INITVAL_12[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[304 + i] = INITVAL_13[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[320 + i] = INITVAL_14[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[336 + i] = INITVAL_15[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[352 + i] = INITVAL_16[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[368 + i] = INITVAL_17[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[384 + i] = INITVAL_18[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[400 + i] = INITVAL_19[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[416 + i] = INITVAL_1A[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[432 + i] = INITVAL_1B[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[448 + i] = INITVAL_1C[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[464 + i] = INITVAL_1D[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[480 + i] = INITVAL_1E[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[496 + i] = INITVAL_1F[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[512 + i] = INITVAL_20[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[528 + i] = INITVAL_21[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[544 + i] = INITVAL_22[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[560 + i] = INITVAL_23[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[576 + i] = INITVAL_24[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[592 + i] = INITVAL_25[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[608 + i] = INITVAL_26[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[624 + i] = INITVAL_27[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[640 + i] = INITVAL_28[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[656 + i] = INITVAL_29[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[672 + i] = INITVAL_2A[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[688 + i] = INITVAL_2B[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[704 + i] = INITVAL_2C[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[720 + i] = INITVAL_2D[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[736 + i] = INITVAL_2E[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[752 + i] = INITVAL_2F[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[768 + i] = INITVAL_30[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[784 + i] = INITVAL_31[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[800 + i] = INITVAL_32[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[816 + i] = INITVAL_33[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[832 + i] = INITVAL_34[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[848 + i] = INITVAL_35[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[864 + i] = INITVAL_36[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[880 + i] = INITVAL_37[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[896 + i] = INITVAL_38[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[912 + i] = INITVAL_39[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[928 + i] = INITVAL_3A[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[944 + i] = INITVAL_3B[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[960 + i] = INITVAL_3C[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[976 + i] = INITVAL_3D[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[992 + i] = INITVAL_3E[20 * i +: 18];
        for (i = 0; i < 16; i = i + 1) mem[1008 + i] = INITVAL_3F[20 * i +: 18];
        if (WIDE) begin
            if (REGMODE_A != REGMODE_B)
                $fatal(1, "DP16KD model: in the 36-bit mode REGMODE_A and REGMODE_B must be equal");
            for (i = 0; i < 1024; i = i + 1)
                if (mem[i] != 18'd0) $fatal(1, "DP16KD model: INITVAL is not modelled in the 36-bit mode");
        end else if (DATA_WIDTH_A != 18 || DATA_WIDTH_B != 18) begin
            $fatal(1, "DP16KD model: DATA_WIDTH_A %0d, DATA_WIDTH_B %0d is not modelled", DATA_WIDTH_A,
                   DATA_WIDTH_B);
        end
        if (REGMODE_A != "NOREG" && REGMODE_A != "OUTREG")
            $fatal(1, "DP16KD model: REGMODE_A %s is not modelled", REGMODE_A);
        if (WRITEMODE_A != "NORMAL") $fatal(1, "DP16KD model: WRITEMODE_A %s is not modelled", WRITEMODE_A);
        if (CLKAMUX != "CLKA") $fatal(1, "DP16KD model: CLKAMUX %s is not modelled", CLKAMUX);
        if (REGMODE_B != "NOREG" && REGMODE_B != "OUTREG")
            $fatal(1, "DP16KD model: REGMODE_B %s is not modelled", REGMODE_B);
        if (CLKBMUX != "CLKB") $fatal(1, "DP16KD model: CLKBMUX %s is not modelled", CLKBMUX);
    end

    // the 512 x 36 mode
    localparam WIDE = DATA_WIDTH_A == 36 && DATA_WIDTH_B == 36;
    wire [17:0] dib = {DIB17, DIB16, DIB15, DIB14, DIB13, DIB12, DIB11, DIB10, DIB9, DIB8,
                       DIB7, DIB6, DIB5, DIB4, DIB3, DIB2, DIB1, DIB0};
    wire [35:0] di36 = {dib, dia};
    reg [35:0] mem36 [0:511];
    reg [35:0] latch36 = 36'd0;
    reg [35:0] outreg36 = 36'd0;
    integer j;
    initial for (j = 0; j < 512; j = j + 1) mem36[j] = 36'd0;
    always @(posedge CLKA) if (WIDE) begin
        if (RSTA) $fatal(1, "DP16KD model: RSTA is not modelled");
        if (CEA && WEA && chip_select == decode)
            for (int k = 0; k < 4; k++)
                if (ada[k]) mem36[ada[13:5]][9 * k +: 9] <= di36[9 * k +: 9];
    end
    always @(posedge CLKB) if (WIDE) begin
        if (WEB || RSTB) $fatal(1, "DP16KD model: writes and reset on port B are not modelled");
        if (CEB && chip_select_b == decode_b) latch36 <= mem36[adb[13:5]];
`ifdef DP16KD_CE_GATES_OUTREG
        if (OCEB && CEB) outreg36 <= latch36;
`else
        if (OCEB) outreg36 <= latch36;
`endif
    end
    wire [35:0] do36 = REGMODE_B == "OUTREG" ? outreg36 : latch36;

    always @(posedge CLKA) if (!WIDE) begin
        if (RSTA) $fatal(1, "DP16KD model: RSTA is not modelled");
        if (CEA && chip_select == decode) begin
            if (WEA) begin
                if (ada[0]) mem[word][8:0] <= dia[8:0];
                if (ada[1]) mem[word][17:9] <= dia[17:9];
            end else begin
                latch <= mem[word];
            end
        end
`ifdef DP16KD_CE_GATES_OUTREG
        if (OCEA && CEA) outreg <= latch;
`else
        if (OCEA) outreg <= latch;
`endif
    end
    always @(posedge CLKB) if (!WIDE) begin
        if (WEB || RSTB) $fatal(1, "DP16KD model: writes and reset on port B are not modelled");
        if (CEB && chip_select_b == decode_b) latch_b <= mem[word_b];
`ifdef DP16KD_CE_GATES_OUTREG
        if (OCEB && CEB) outreg_b <= latch_b;
`else
        if (OCEB) outreg_b <= latch_b;
`endif
    end
    wire [17:0] doa = WIDE ? do36[17:0] : REGMODE_A == "OUTREG" ? outreg : latch;
    wire [17:0] dob = WIDE ? do36[35:18] : REGMODE_B == "OUTREG" ? outreg_b : latch_b;
    assign {DOA17, DOA16, DOA15, DOA14, DOA13, DOA12, DOA11, DOA10, DOA9, DOA8,
            DOA7, DOA6, DOA5, DOA4, DOA3, DOA2, DOA1, DOA0} = doa;
    assign {DOB17, DOB16, DOB15, DOB14, DOB13, DOB12, DOB11, DOB10, DOB9, DOB8,
            DOB7, DOB6, DOB5, DOB4, DOB3, DOB2, DOB1, DOB0} = dob;
endmodule
