/* The firmware of control = "firmware" (hw/fw_engine.py): it executes a program of the systolic
 * ISA (docs/isa.md) as the hardware control does. It fetches the instruction words from DRAM,
 * checks them (opcode, reserved bits, dependency flags; a COMPUTE's sizes and rows when it
 * starts), dispatches them into three queues of the configured depths and runs the queues with
 * their four token channels: LOAD, STORE, CONFIG and SYNC here, one at a time, each COMPUTE on
 * the compute unit, which runs it while this code goes on. Its DRAM traffic follows the rule of docs/isa.md "Performance counters": an element's
 * bytes share a bus beat with the previous element's last beat, every other beat is an access.
 *
 * engine.h is generated from the Python definitions (address map, parameters, ISA fields).
 * The core restarts this code at every start: no initialized writable data (the link checks),
 * the zeroed data is cleared by _start. No division: the core has none. */
#include <stdint.h>
#include "engine.h"

typedef int32_t i32;
typedef uint32_t u32;
typedef int64_t i64;
typedef uint64_t u64;

#define REG(off) (*(volatile u32 *)(CTRL_ADDR + (off)))
#define PARAM(i) (((const volatile u32 *)(RAM_BYTES - 4 * NPARAMS))[i])

/* the fields of an instruction after its header, decoded into f[] by the tables of engine.h
 * (offset, width, signed): f[LOAD_DST_ADDR] and so on */
typedef struct {
    uint16_t offset;
    uint8_t width, is_signed;
} field_t;

static const field_t FIELDS_CONFIG_T[] = FIELDS_CONFIG, FIELDS_LOAD_T[] = FIELDS_LOAD,
                     FIELDS_STORE_T[] = FIELDS_STORE;
static const field_t *const FIELDS[7] = {0, FIELDS_CONFIG_T, FIELDS_LOAD_T, 0, FIELDS_STORE_T, 0, 0};
static const uint8_t NFIELDS[7] = {0, NFIELDS_CONFIG, NFIELDS_LOAD, 0, NFIELDS_STORE, 0, 0};

/* the n fields of table t from the words w into f */
static void decode_fields(const u32 *w, const field_t *t, u32 n, u32 *f) {
    for (u32 i = 0; i < n; i++) {
        const field_t *d = &t[i];
        u32 k = d->offset >> 5, s = d->offset & 31, width = d->width;
        u32 v = w[k] >> s;
        if (s + width > 32) v |= w[k + 1] << (32 - s);
        if (width < 32) {
            u32 mask = (1u << width) - 1;
            v &= mask;
            if (d->is_signed && (v >> (width - 1))) v |= ~mask;
        }
        f[i] = v;
    }
}

/* decoded here: CONFIG, LOAD and STORE (a COMPUTE goes to the unit as words, once checked) */
static void decode(const u32 *w, u32 op, u32 *f) {
    decode_fields(w, FIELDS[op], NFIELDS[op], f);
}

/* -- the instance ---------------------------------------------------------------------------- */
static u32 cols, spad_shift, acc_shift, acc_bits, acc_signed, input_bits, input_signed, spad_bits;
static u32 features, table_rows, token_depth, depth[3], rows, spad_rows, acc_rows, dataflow_os;
static i32 acc_lo, acc_hi, out_lo, out_hi;
static u32 dram_base;

/* -- DRAM: byte reads through the last beat read, byte writes gathered into one beat --------- */
static u32 page, rd_beat, rd_word, rd_valid, wr_beat, wr_word, wr_strb, wr_valid;

static volatile u32 *dram_word(u32 addr) {
    u32 p = addr >> 31;
    if (p != page) {
        page = p;
        REG(CTRL_PAGE) = p;
    }
    return (volatile u32 *)(DRAM_WINDOW | (addr & 0x7ffffffcu));
}

static u32 read_byte(u32 addr) {
    u32 beat = addr >> 2;
    if (!rd_valid || beat != rd_beat) {
        rd_word = *dram_word(addr);
        rd_beat = beat;
        rd_valid = 1;
    }
    return (rd_word >> ((addr & 3) * 8)) & 0xff;
}

/* ``nbytes`` (1..4) little-endian bytes at addr */
static u32 read_elem(u32 addr, u32 nbytes) {
    u32 v = 0;
    for (u32 i = 0; i < nbytes; i++) v |= read_byte(addr + i) << (8 * i);
    return v;
}

static void flush_write(void) {
    if (wr_valid) {
        REG(CTRL_WSTRB) = wr_strb;
        *dram_word(wr_beat << 2) = wr_word;
        wr_valid = 0;
    }
}

static void write_elem(u32 addr, u32 value, u32 nbytes) {
    for (u32 i = 0; i < nbytes; i++, addr++) {
        u32 beat = addr >> 2, lane = addr & 3;
        if (wr_valid && beat != wr_beat) flush_write();
        if (!wr_valid) {
            wr_valid = 1;
            wr_beat = beat;
            wr_word = 0;
            wr_strb = 0;
        }
        wr_word = (wr_word & ~(0xffu << (8 * lane))) | (((value >> (8 * i)) & 0xff) << (8 * lane));
        wr_strb |= 1u << lane;
    }
}

/* each instruction counts its beats on its own */
static void start_access(void) {
    rd_valid = 0;
    wr_valid = 0;
}

/* -- counting flags ---------------------------------------------------------------------------- */
static u32 flags;

static void set_flags(u32 value) {
    if (value != flags) {
        flags = value;
        REG(CTRL_FLAGS) = value;
    }
}

/* -- values: accumulator and input elements fit 32 bits (check_firmware_config) --------------- */
static i32 sign_extend(u32 raw, u32 bits, u32 is_signed) {
    if (bits >= 32) return (i32)raw;
    u32 mask = (1u << bits) - 1;
    raw &= mask;
    return (i32)(is_signed && (raw >> (bits - 1)) ? raw | ~mask : raw);
}

static i32 clamp(i64 x, i32 lo, i32 hi) { return x < lo ? lo : x > hi ? hi : (i32)x; }

/* x * 2**-s + zp rounded half to even (docs/isa.md STORE, "Rounding"), clamped to 32 bits (the
 * activation's bounds and the output range lie inside them, so the result is the same) */
static i32 round_out(i64 x, u32 s, i32 zp, u32 tie_out) {
    i64 y = x;
    if (s) y = (i64)((u64)x + ((u64)1 << (s - 1))) >> s;
    if (tie_out) y += zp;
    if (s && ((u64)x & (((u64)1 << s) - 1)) == ((u64)1 << (s - 1))) y &= ~(i64)1;
    if (!tie_out) y += zp;
    return clamp(y, INT32_MIN, INT32_MAX);
}

/* -- SFU registers (CONFIG) and the requantize table ------------------------------------------- */
static i32 zp_out, act_lo, act_hi, avg_mult, res_zp, res_mult;
static u32 avg_shift, tie_out, avg_tie_out;
static i32 table[TABLE_BYTES / 4];      /* row-major: (row * cols + channel) * 3 + (bias, mult, shift) */

/* activation, then saturation to the output range */
static i32 finish(i32 q, u32 act) {
    if (act == 1 || act == 2) q = q < zp_out ? zp_out : q;
    if (act == 3) q = q < act_lo ? act_lo : q;
    if (act >= 2) q = q > act_hi ? act_hi : q;
    return clamp(q, out_lo, out_hi);
}

/* one accumulator element a through the SFU (residual element r when has_res) */
static i32 pointwise(i32 a, const i32 *entry, u32 act, u32 has_res, i32 r) {
    i32 t = clamp((i64)a + entry[0], acc_lo, acc_hi);
    i64 x = (i64)t * entry[1];
    if (has_res) x += (i64)(r - res_zp) * res_mult;
    return finish(round_out(x, (u32)entry[2], zp_out, tie_out), act);
}

static i32 acc_element(u32 row, u32 c) {
    return sign_extend(*(volatile u32 *)(ACC_ADDR + (((row << acc_shift) | c) << 2)), acc_bits, acc_signed);
}

/* -- LOAD ---------------------------------------------------------------------------------------- */
static void execute_load(const u32 *f) {
    u32 dst = f[LOAD_DST], widen = f[LOAD_WIDEN];
    u32 row0 = f[LOAD_DST_ADDR], col0 = f[LOAD_DST_COL];
    u32 py = f[LOAD_PITCH_Y], px = f[LOAD_PITCH_X], pc = f[LOAD_PITCH_C];
    u32 bounded = f[LOAD_BOUNDED];
    i32 height = (i32)f[LOAD_HEIGHT], width = (i32)f[LOAD_WIDTH];
    i32 y0 = (i32)f[LOAD_Y0], x0 = (i32)f[LOAD_X0], pad = (i32)f[LOAD_PAD_VALUE];
    u32 n_outer = f[LOAD_ROWS_OUTER], n_inner = f[LOAD_ROWS_INNER];
    u32 n_segs = f[LOAD_SEGS], seg_len = f[LOAD_SEG_LEN];
    i32 ody = (i32)f[LOAD_OUTER_DY], odx = (i32)f[LOAD_OUTER_DX], odc = (i32)f[LOAD_OUTER_DC];
    i32 idy = (i32)f[LOAD_INNER_DY], idx = (i32)f[LOAD_INNER_DX], idc = (i32)f[LOAD_INNER_DC];
    i32 sdy = (i32)f[LOAD_SEG_DY], sdx = (i32)f[LOAD_SEG_DX], sdc = (i32)f[LOAD_SEG_DC];
    i32 edy = (i32)f[LOAD_ELEM_DY], edx = (i32)f[LOAD_ELEM_DX], edc = (i32)f[LOAD_ELEM_DC];
    /* address steps of each loop level (32-bit wrap-around, as the DMA's adders) */
    u32 outer_step = (u32)ody * py + (u32)odx * px + (u32)odc * pc;
    u32 inner_step = (u32)idy * py + (u32)idx * px + (u32)idc * pc;
    u32 seg_step = (u32)sdy * py + (u32)sdx * px + (u32)sdc * pc;
    u32 elem_step = (u32)edy * py + (u32)edx * px + (u32)edc * pc;
    u32 esz = dst == 0 ? spad_bits / 8 : dst == 1 ? (widen ? input_bits / 8 : acc_bits / 8) : 12;
    u32 spad_mask = spad_bits >= 32 ? 0xffffffffu : (1u << spad_bits) - 1;

    start_access();
    u32 o_addr = dram_base + f[LOAD_DRAM_ADDR] + (u32)y0 * py + (u32)x0 * px;
    i32 o_y = y0, o_x = x0;
    u32 row = row0;
    for (u32 o = 0; o < n_outer; o++, o_addr += outer_step, o_y += ody, o_x += odx) {
        u32 i_addr = o_addr;
        i32 i_y = o_y, i_x = o_x;
        for (u32 i = 0; i < n_inner; i++, i_addr += inner_step, i_y += idy, i_x += idx, row++) {
            u32 s_addr = i_addr, elem = col0;
            i32 s_y = i_y, s_x = i_x;
            for (u32 s = 0; s < n_segs; s++, s_addr += seg_step, s_y += sdy, s_x += sdx) {
                u32 addr = s_addr;
                i32 y = s_y, x = s_x;
                for (u32 e = 0; e < seg_len; e++, addr += elem_step, y += edy, x += edx, elem++) {
                    u32 inside = !bounded || (y >= 0 && y < height && x >= 0 && x < width);
                    if (dst == 2) {         /* a requantize entry: bias, multiplier, shift */
                        i32 bias = (i32)read_elem(addr, 4), mult = (i32)read_elem(addr + 4, 4);
                        i32 shift = (i32)(read_elem(addr + 8, 4) & 63);
                        /* a row or channel past the table (an ISA error the golden model reports)
                         * must not overwrite the firmware's own data */
                        if (row < table_rows && elem < cols) {
                            i32 *entry = &table[(row * cols + elem) * 3];
                            entry[0] = bias;
                            entry[1] = mult;
                            entry[2] = shift;
                        }
                    } else if (dst == 0) {
                        u32 v = inside ? read_elem(addr, esz) : (u32)pad;
                        *(volatile u32 *)(SPAD_ADDR + (((row << spad_shift) | elem) << 2)) = v & spad_mask;
                    } else {
                        i32 v = pad;
                        if (inside) {
                            u32 raw = read_elem(addr, esz);
                            v = widen ? sign_extend(raw, input_bits, input_signed)
                                      : sign_extend(raw, acc_bits, acc_signed);
                        }
                        *(volatile u32 *)(ACC_ADDR + (((row << acc_shift) | elem) << 2)) = (u32)v;
                    }
                }
            }
        }
    }
}

/* -- STORE: every output element is a window (1x1 without pooling) over the SFU's results ------ */
static void execute_store(const u32 *f) {
    u32 n = f[STORE_N], acc_addr = f[STORE_ACC_ADDR];
    u32 in_h = f[STORE_IN_H], in_w = f[STORE_IN_W];
    u32 out_h = f[STORE_OUT_H], out_w = f[STORE_OUT_W];
    u32 py = f[STORE_PITCH_Y], px = f[STORE_PITCH_X], pc = f[STORE_PITCH_C];
    u32 raw = f[STORE_OUT_TYPE], act = f[STORE_ACT], pool = f[STORE_POOL];
    u32 pool_h = 1, pool_w = 1, stride_h = 1, stride_w = 1;
    i32 pad_top = 0, pad_left = 0;
    if (pool) {
        pool_h = f[STORE_POOL_H];
        pool_w = f[STORE_POOL_W];
        stride_h = f[STORE_STRIDE_H];
        stride_w = f[STORE_STRIDE_W];
        pad_top = (i32)f[STORE_PAD_TOP];
        pad_left = (i32)f[STORE_PAD_LEFT];
    }
    u32 has_res = f[STORE_RESIDUAL];
    const i32 *entries = &table[f[STORE_QROW] * cols * 3];
    u32 esz = raw ? acc_bits / 8 : input_bits / 8;

    start_access();
    u32 out_row = dram_base + f[STORE_DRAM_ADDR];
    u32 res_row = dram_base + f[STORE_RES_ADDR];
    for (u32 oy = 0; oy < out_h; oy++, out_row += py, res_row += py) {
        u32 out_pix = out_row, res_pix = res_row;
        for (u32 ox = 0; ox < out_w; ox++, out_pix += px, res_pix += px) {
            u32 out_addr = out_pix, res_addr = res_pix;
            for (u32 c = 0; c < n; c++, out_addr += pc, res_addr += pc) {
                const i32 *entry = &entries[c * 3];
                i32 r = has_res ? sign_extend(read_elem(res_addr, input_bits / 8), input_bits, input_signed) : 0;
                i32 best = INT32_MIN, sum = 0;
                i32 wy = (i32)(oy * stride_h) - pad_top;
                for (u32 i = 0; i < pool_h; i++, wy++) {
                    i32 wx = (i32)(ox * stride_w) - pad_left;
                    for (u32 j = 0; j < pool_w; j++, wx++) {
                        if (wy < 0 || wy >= (i32)in_h || wx < 0 || wx >= (i32)in_w) {
                            sum += zp_out;      /* average: pixels outside the image count zp_out */
                            continue;
                        }
                        i32 a = acc_element(acc_addr + (u32)wy * in_w + (u32)wx, c);
                        i32 p = raw ? a : pointwise(a, entry, act, has_res, r);
                        sum += p;
                        best = p > best ? p : best;
                    }
                }
                if (pool == 2)
                    best = finish(round_out((i64)(sum - (i32)(pool_h * pool_w) * zp_out) * avg_mult, avg_shift,
                                            zp_out, avg_tie_out), act);
                write_elem(out_addr, (u32)best, esz);
            }
        }
    }
    flush_write();
}

static void execute_config(const u32 *f) {
    zp_out = (i32)f[CONFIG_ZP_OUT];
    act_lo = (i32)f[CONFIG_ACT_LO];
    act_hi = (i32)f[CONFIG_ACT_HI];
    avg_mult = (i32)f[CONFIG_AVG_MULT];
    avg_shift = f[CONFIG_AVG_SHIFT];
    res_zp = (i32)f[CONFIG_RES_ZP];
    res_mult = (i32)f[CONFIG_RES_MULT];
    tie_out = f[CONFIG_TIE_OUT];
    avg_tie_out = f[CONFIG_AVG_TIE_OUT];
}

/* -- queues and tokens --------------------------------------------------------------------------- */
enum { QLOAD, QCOMPUTE, QSTORE };
/* channels: load->compute, compute->load, compute->store, store->compute */
static const int8_t IN_PREV[3] = {-1, 0, 2}, IN_NEXT[3] = {1, 3, -1};
static const int8_t OUT_PREV[3] = {-1, 1, 3}, OUT_NEXT[3] = {0, 2, -1};
static u32 tokens[4];

/* a queued instruction: its index and header (its words are read again when it starts) */
typedef struct {
    u32 pc, header;
} entry_t;

static entry_t queue[3][MAX_QUEUE_DEPTH];
static u32 q_head[3], q_count[3];
/* pushes owed by completed instructions: bit 0 push_prev, bit 1 push_next. A LOAD's or a STORE's
 * queue starts nothing else until they are done (owed); COMPUTEs are started while earlier ones
 * run on the unit, so theirs wait in a ring, in order: issued, completed by the unit, pushed. */
static u32 owed[3];
#define RING 8
static u32 ring[RING], c_issued, c_completed, c_pushed;

static u32 push(u32 bits, int q) {
    if ((bits & 1) && tokens[OUT_PREV[q]] < token_depth) {
        tokens[OUT_PREV[q]]++;
        bits &= ~1u;
    }
    if ((bits & 2) && tokens[OUT_NEXT[q]] < token_depth) {
        tokens[OUT_NEXT[q]]++;
        bits &= ~2u;
    }
    return bits;
}

/* the rules of docs/isa.md for a COMPUTE (the golden model's, and the hardware control's
 * ComputeCheck): k, m and n in their ranges, the rows of A, B and the accumulator inside their
 * memories, preload = 0 only after a preload of the same k and n in this program (WS) and always
 * (OS). The compute unit keeps only the bits a legal COMPUTE needs: an illegal one could hang it. */
static const field_t FIELDS_COMPUTE_T[] = FIELDS_COMPUTE;
static u32 have_weights, weights_k, weights_n;

static u32 compute_legal(const u32 *w) {
    u32 f[NFIELDS_COMPUTE];
    decode_fields(w, FIELDS_COMPUTE_T, NFIELDS_COMPUTE, f);
    u32 m = f[COMPUTE_M], k = f[COMPUTE_K], n = f[COMPUTE_N], preload = f[COMPUTE_PRELOAD];
    if (n == 0 || n > cols || f[COMPUTE_ACC_ADDR] + m > acc_rows) return 0;
    if (dataflow_os) {
        return !preload && m != 0 && m <= rows && k != 0 && f[COMPUTE_A_ADDR] + k <= spad_rows
               && f[COMPUTE_B_ADDR] + k <= spad_rows;
    }
    if (k == 0 || k > rows || m == 0 || f[COMPUTE_A_ADDR] + m > spad_rows) return 0;
    if (!preload) return have_weights && k == weights_k && n == weights_n;
    if (f[COMPUTE_B_ADDR] + k > spad_rows) return 0;
    have_weights = 1;
    weights_k = k;
    weights_n = n;
    return 1;
}

static void issue_compute(const u32 *w, u32 pc) {
    while (REG(CTRL_ISSUE)) {
    }
    for (u32 i = 0; i < COMPUTE_CMD_WORDS; i++) REG(CTRL_CMD + 4 * i) = w[i];
    REG(CTRL_ISSUE) = pc;
    ring[c_issued % RING] = (w[0] >> (FLAGS_SHIFT + 2)) & 3;
    c_issued++;
}

/* -- errors ---------------------------------------------------------------------------------------- */
static u32 halted;

static void fail(u32 code, u32 pc) {
    if (halted) return;
    halted = 1;
    /* what is queued is dropped; COMPUTEs on the unit finish (their pushes are dropped) */
    for (int q = 0; q < 3; q++) q_count[q] = 0;
    REG(CTRL_ERROR_PC) = pc;
    REG(CTRL_ERROR) = code;
}

static void check_axi(u32 pc) {
    u32 resp = REG(CTRL_AXI_ERR);
    if (resp) fail(resp == 2 ? ERR_SLVERR : ERR_DECERR, pc);
}

/* -- dispatch ---------------------------------------------------------------------------------------- */
static const uint16_t USED_BITS[7] = {0, USED_BITS_CONFIG, USED_BITS_LOAD, USED_BITS_COMPUTE, USED_BITS_STORE,
                                      USED_BITS_SYNC, USED_BITS_FINISH};
/* dependency flags a queue allows: bit 0 pop_prev, 1 pop_next, 2 push_prev, 3 push_next; each
 * opcode's queue (3: SYNC's queue field says) */
static const uint8_t LEGAL[3] = LEGAL_FLAGS, QUEUE_OF[7] = QUEUE_OF_OPCODE;

static u32 reserved_clear(const u32 *w, u32 used) {
    u32 k = used >> 5, s = used & 31;
    if (s) {
        if (w[k] >> s) return 0;
        k++;
    }
    for (; k < INSTR_WORDS; k++)
        if (w[k]) return 0;
    return 1;
}

static u32 next[INSTR_WORDS];   /* the next instruction, fetched, waiting for room in its queue */
static u32 next_valid, pc_next, finished, prog_addr, prog_len;

/* instruction pc's words from DRAM (not counted as DMA reads) */
static void fetch(u32 pc, u32 *w) {
    set_flags(flags & ~FLAG_COUNT_READS);
    u32 addr = prog_addr + pc * (4 * INSTR_WORDS);
    for (u32 i = 0; i < INSTR_WORDS; i++) w[i] = *dram_word(addr + 4 * i);
}

/* fetch, check and dispatch one instruction if its queue has room; 1 if one was */
static u32 dispatch(void) {
    if (!next_valid) {
        if (pc_next >= prog_len) {
            fail(ERR_NO_FINISH, pc_next);
            return 0;
        }
        set_flags(flags | FLAG_STALL_FETCH);
        fetch(pc_next, next);
        set_flags(flags & ~FLAG_STALL_FETCH);
        check_axi(pc_next);
        if (halted) return 0;
        next_valid = 1;
    }
    u32 op = next[0] & OPCODE_MASK, group = (next[0] >> FLAGS_SHIFT) & 15;
    u32 known = op >= OP_CONFIG && op <= OP_FINISH;
    u32 q = !known ? 3 : op == OP_SYNC ? (next[0] >> SYNC_QUEUE_SHIFT) & SYNC_QUEUE_MASK : QUEUE_OF[op];
    if (!known || (op != OP_FINISH && q == 3) || !reserved_clear(next, USED_BITS[op])) {
        fail(ERR_ILLEGAL, pc_next);
        return 0;
    }
    if (op == OP_FINISH ? group != 0 : (group & ~LEGAL[q]) != 0) {
        fail(ERR_FLAGS, pc_next);
        return 0;
    }
    if (op != OP_FINISH) {
        if (q_count[q] == depth[q]) {
            set_flags(flags | FLAG_STALL_DISPATCH);
            return 0;
        }
        entry_t *slot = &queue[q][(q_head[q] + q_count[q]) % MAX_QUEUE_DEPTH];
        slot->pc = pc_next;
        slot->header = next[0];
        q_count[q]++;
    } else {
        finished = 1;
    }
    set_flags(flags & ~FLAG_STALL_DISPATCH);
    next_valid = 0;
    REG(CTRL_INSTR) = 1;
    pc_next++;
    REG(CTRL_PC) = pc_next;
    return 1;
}

/* start the head of queue q if its tokens are there; 1 if it did */
static const u32 STALL[3] = {FLAG_STALL_LOAD_TOKEN, FLAG_STALL_COMPUTE_TOKEN, FLAG_STALL_STORE_TOKEN};

static u32 run_queue(int q) {
    if (q_count[q] == 0 || owed[q] || (q == QCOMPUTE && c_issued - c_pushed >= 4)) return 0;
    entry_t *e = &queue[q][q_head[q]];
    u32 h = e->header, pc = e->pc, pop_prev = (h >> FLAGS_SHIFT) & 1, pop_next = (h >> (FLAGS_SHIFT + 1)) & 1;
    if ((pop_prev && tokens[IN_PREV[q]] == 0) || (pop_next && tokens[IN_NEXT[q]] == 0)) {
        set_flags(flags | STALL[q]);
        return 0;
    }
    set_flags(flags & ~STALL[q]);
    if (pop_prev) tokens[IN_PREV[q]]--;
    if (pop_next) tokens[IN_NEXT[q]]--;
    q_head[q] = (q_head[q] + 1) % MAX_QUEUE_DEPTH;
    q_count[q]--;
    u32 op = h & OPCODE_MASK;
    u32 w[INSTR_WORDS], f[NFIELDS_LOAD];
    if (op != OP_SYNC) {
        fetch(pc, w);
        decode(w, op, f);
    }
    if (op == OP_COMPUTE) {
        if (compute_legal(w))
            issue_compute(w, pc);
        else
            fail(ERR_ILLEGAL, pc);
        return 1;
    }
    if (op == OP_LOAD) {
        set_flags(flags | FLAG_LOAD_BUSY | FLAG_COUNT_READS);
        execute_load(f);
        set_flags(flags & ~(FLAG_LOAD_BUSY | FLAG_COUNT_READS));
        check_axi(pc);
    } else if (op == OP_STORE) {
        set_flags(flags | FLAG_STORE_BUSY | FLAG_COUNT_READS);
        execute_store(f);
        set_flags(flags & ~(FLAG_STORE_BUSY | FLAG_COUNT_READS));
        check_axi(pc);
    } else if (op == OP_CONFIG) {
        set_flags(flags | FLAG_STORE_BUSY);
        execute_config(f);
        set_flags(flags & ~FLAG_STORE_BUSY);
    }
    if (!halted) owed[q] = push((h >> (FLAGS_SHIFT + 2)) & 3, q);
    return 1;
}

int main(void) {
    cols = PARAM(P_COLS);
    spad_shift = PARAM(P_SPAD_SHIFT);
    acc_shift = PARAM(P_ACC_SHIFT);
    acc_bits = PARAM(P_ACC_BITS);
    acc_signed = PARAM(P_ACC_SIGNED);
    input_bits = PARAM(P_INPUT_BITS);
    input_signed = PARAM(P_INPUT_SIGNED);
    spad_bits = PARAM(P_SPAD_ELEM_BITS);
    features = PARAM(P_FEATURES);
    table_rows = PARAM(P_TABLE_ROWS);
    rows = PARAM(P_ROWS);
    spad_rows = PARAM(P_SPAD_ROWS);
    acc_rows = PARAM(P_ACC_ROWS);
    dataflow_os = PARAM(P_DATAFLOW_OS);
    token_depth = PARAM(P_TOKEN_DEPTH);
    depth[QLOAD] = PARAM(P_QUEUE_DEPTH_LOAD);
    depth[QCOMPUTE] = PARAM(P_QUEUE_DEPTH_COMPUTE);
    depth[QSTORE] = PARAM(P_QUEUE_DEPTH_STORE);
    acc_lo = (i32)PARAM(P_ACC_LO);
    acc_hi = (i32)PARAM(P_ACC_HI);
    out_lo = (i32)PARAM(P_OUT_LO);
    out_hi = (i32)PARAM(P_OUT_HI);
    prog_addr = REG(CTRL_PROG_ADDR);
    prog_len = REG(CTRL_PROG_LEN);
    dram_base = REG(CTRL_DRAM_BASE);

    for (;;) {
        /* COMPUTEs the unit completed: their pushes become owed, in order */
        u32 hw = REG(CTRL_COMPLETED);
        while (((hw - c_completed) & 0xff) != 0) c_completed++;
        while (c_pushed != c_completed) {
            u32 *bits = &ring[c_pushed % RING];
            if (!halted) *bits = push(*bits, QCOMPUTE);
            if (*bits && !halted) break;
            c_pushed++;
        }
        if (halted) {
            if (c_completed == c_issued) break;
            continue;
        }
        for (int q = 0; q < 3; q += 2)
            if (owed[q]) owed[q] = push(owed[q], q);
        run_queue(QCOMPUTE);
        run_queue(QLOAD);
        run_queue(QSTORE);
        if (!finished) dispatch();
        if (finished && !q_count[0] && !q_count[1] && !q_count[2] && !owed[0] && !owed[2]
            && c_pushed == c_issued)
            break;
    }
    set_flags(0);
    REG(CTRL_DONE) = 1;
    for (;;) {
    }
}

extern u32 __bss_start[], __bss_end[];

__attribute__((section(".text.start"), naked, noreturn)) void _start(void) {
    __asm__ volatile(
        "la sp, __stack_top\n"
        "la t0, __bss_start\n"
        "la t1, __bss_end\n"
        "1: bgeu t0, t1, 2f\n"
        "sw zero, 0(t0)\n"
        "addi t0, t0, 4\n"
        "j 1b\n"
        "2: call main\n"
        "3: j 3b\n");
}
