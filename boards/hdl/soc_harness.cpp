// Verilator harness of the systolic SoC (top module systolic_soc): a simulated board whose UART
// is a TCP socket.
//
// The harness toggles the clock itself. It listens on 127.0.0.1 (port 0: an ephemeral port),
// writes the chosen port to --port-file (and prints it), accepts one client, then serializes the
// bytes the client sends onto uart_rx (8N1, LSB first, --divisor cycles per bit) and deserializes
// uart_tx back into bytes for the client. It exits when the client disconnects, after
// --max-cycles clock cycles, or after --idle-seconds of wall time without any traffic while the
// SoC is idle. Built by systolic.boards.simlink (verilator --exe --build).
//
// While the SoC is idle (busy low, both UART lines idle for --grace-cycles cycles, nothing queued)
// the simulation sleeps in poll() instead of spinning: no simulated time passes until the client
// sends the next byte. Everything in the SoC is clocked, so an idle SoC changes no state then.
//
// A SoC whose accelerator has a compute clock of its own (port compute_clk) is built with
// SYSTOLIC_CLOCK_HALF_PS, SYSTOLIC_COMPUTE_HALF_PS and SYSTOLIC_COMPUTE_FIRST_PS defined (the
// half periods of clk and compute_clk and the time of compute_clk's first rising edge, ps): the
// harness then toggles compute_clk at its own edges between those of clk, and a waveform's time
// unit is the picosecond (else one half period of clk).
//
// Exit status: 0 client disconnected, 2 bad arguments or socket error, 3 max cycles reached,
// 4 idle time limit reached.

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "Vsystolic_soc.h"
#include "verilated.h"
#ifdef SYSTOLIC_TRACE
#include "verilated_vcd_c.h"
#endif

namespace {

struct Options {
    long divisor = 8;                 // clock cycles per UART bit
    long port = 0;                    // TCP port; 0 = ephemeral
    std::string port_file;            // where the chosen port is written
    uint64_t max_cycles = 0;          // 0 = no limit
    double idle_seconds = 60.0;       // wall time without traffic before giving up
    uint64_t grace_cycles = 1 << 16;  // idle cycles simulated before sleeping
    long reset_cycles = 8;            // cycles rst is held high at start
    std::string vcd;                  // waveform file (builds with SYSTOLIC_TRACE only)
};

[[noreturn]] void die(int status, const char* what) {
    fprintf(stderr, "soc_harness: %s\n", what);
    fflush(stderr);
    exit(status);
}

[[noreturn]] void die_errno(const char* what) {
    fprintf(stderr, "soc_harness: %s: %s\n", what, strerror(errno));
    fflush(stderr);
    exit(2);
}

double now_seconds() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        std::string arg = argv[i];
        if (arg.rfind("+", 0) == 0) continue;  // Verilator plusargs
        if (i + 1 >= argc) {
            fprintf(stderr, "soc_harness: %s needs a value\n", arg.c_str());
            exit(2);
        }
        const char* value = argv[++i];
        if (arg == "--divisor") o.divisor = strtol(value, nullptr, 10);
        else if (arg == "--port") o.port = strtol(value, nullptr, 10);
        else if (arg == "--port-file") o.port_file = value;
        else if (arg == "--max-cycles") o.max_cycles = strtoull(value, nullptr, 10);
        else if (arg == "--idle-seconds") o.idle_seconds = strtod(value, nullptr);
        else if (arg == "--grace-cycles") o.grace_cycles = strtoull(value, nullptr, 10);
        else if (arg == "--reset-cycles") o.reset_cycles = strtol(value, nullptr, 10);
        else if (arg == "--vcd") o.vcd = value;
        else {
            fprintf(stderr, "soc_harness: unknown option %s\n", arg.c_str());
            exit(2);
        }
    }
    if (o.divisor < 2) die(2, "--divisor must be at least 2");
    if (o.port < 0 || o.port > 65535) die(2, "--port must be between 0 and 65535");
    if (o.idle_seconds <= 0) die(2, "--idle-seconds must be positive");
    return o;
}

// The host-to-device UART transmitter: one 8N1 frame per byte on uart_rx.
struct Serializer {
    long divisor;
    std::deque<uint8_t> queue;
    uint16_t frame = 0;   // bits still to send, LSB first
    int bits = 0;         // bits left in frame
    long left = 0;        // cycles left of the current bit
    bool line = true;

    bool busy() const { return bits > 0 || !queue.empty(); }

    // the uart_rx level for the next cycle
    bool step() {
        if (left == 0) {
            if (bits == 0 && !queue.empty()) {
                // start bit 0, 8 data bits, stop bit 1
                frame = static_cast<uint16_t>((queue.front() << 1) | (1u << 9));
                queue.pop_front();
                bits = 10;
            }
            if (bits > 0) {
                line = frame & 1;
                frame >>= 1;
                --bits;
                left = divisor;
            } else {
                line = true;
            }
        }
        if (left > 0) --left;
        return line;
    }
};

// The device-to-host UART receiver: samples uart_tx in the middle of each bit.
struct Deserializer {
    long divisor;
    bool active = false;
    long count = 0;    // cycles since the start bit's first cycle
    int bit = 0;       // next bit to sample: 0 start, 1..8 data, 9 stop
    uint8_t value = 0;
    uint64_t framing_errors = 0;

    // feed one cycle of uart_tx; returns true and sets *out when a byte is complete
    bool step(bool line, uint8_t* out) {
        if (!active) {
            if (!line) {
                active = true;
                count = 0;
                bit = 0;
                value = 0;
            }
            return false;
        }
        ++count;
        if (count != divisor / 2 + static_cast<long>(bit) * divisor) return false;
        if (bit == 0) {
            if (line) active = false;  // a glitch, not a start bit
            else bit = 1;
            return false;
        }
        if (bit <= 8) {
            value |= static_cast<uint8_t>(line) << (bit - 1);
            ++bit;
            return false;
        }
        active = false;
        if (!line) {
            ++framing_errors;
            return false;
        }
        *out = value;
        return true;
    }
};

int listen_socket(const Options& o) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) die_errno("socket");
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(o.port));
    if (bind(fd, reinterpret_cast<struct sockaddr*>(&addr), sizeof addr) < 0) die_errno("bind");
    if (listen(fd, 1) < 0) die_errno("listen");
    socklen_t len = sizeof addr;
    if (getsockname(fd, reinterpret_cast<struct sockaddr*>(&addr), &len) < 0) die_errno("getsockname");
    int port = ntohs(addr.sin_port);
    printf("soc_harness: listening on 127.0.0.1:%d\n", port);
    fflush(stdout);
    if (!o.port_file.empty()) {
        // written under another name and renamed, so that a reader never sees a partial file
        std::string partial = o.port_file + ".partial";
        FILE* f = fopen(partial.c_str(), "w");
        if (f == nullptr) die_errno("cannot write the port file");
        fprintf(f, "%d\n", port);
        fclose(f);
        if (rename(partial.c_str(), o.port_file.c_str()) < 0) die_errno("cannot rename the port file");
    }
    return fd;
}

int accept_client(int listener, const Options& o) {
    double deadline = now_seconds() + o.idle_seconds;
    for (;;) {
        struct pollfd p = {listener, POLLIN, 0};
        int left_ms = static_cast<int>((deadline - now_seconds()) * 1000);
        if (left_ms <= 0) die(4, "no client connected within the idle time limit");
        int n = poll(&p, 1, left_ms);
        if (n < 0 && errno != EINTR) die_errno("poll");
        if (n > 0) break;
    }
    int fd = accept(listener, nullptr, nullptr);
    if (fd < 0) die_errno("accept");
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

// Reads what the client sent into queue; returns false when the client has disconnected.
bool receive(int fd, std::deque<uint8_t>& queue) {
    uint8_t buf[4096];
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n > 0) {
            queue.insert(queue.end(), buf, buf + n);
            continue;
        }
        if (n == 0) return false;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
        if (errno == EINTR) continue;
        return false;  // connection reset
    }
}

bool send_all(int fd, const uint8_t* data, size_t size) {
    while (size > 0) {
        ssize_t n = send(fd, data, size, MSG_NOSIGNAL);
        if (n > 0) {
            data += n;
            size -= static_cast<size_t>(n);
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            struct pollfd p = {fd, POLLOUT, 0};
            poll(&p, 1, 100);
            continue;
        }
        return false;
    }
    return true;
}

}  // namespace

int main(int argc, char** argv) {
    signal(SIGPIPE, SIG_IGN);
    Options o = parse(argc, argv);
    auto context = std::make_unique<VerilatedContext>();
    context->commandArgs(argc, argv);
    auto top = std::make_unique<Vsystolic_soc>(context.get());
#ifdef SYSTOLIC_TRACE
    std::unique_ptr<VerilatedVcdC> trace;
    if (!o.vcd.empty()) {
        context->traceEverOn(true);
        trace = std::make_unique<VerilatedVcdC>();
        top->trace(trace.get(), 99);
        trace->open(o.vcd.c_str());
    }
#endif
    int listener = listen_socket(o);

    Serializer to_device{o.divisor};
    Deserializer from_device{o.divisor};
    uint64_t cycle = 0;
    uint64_t quiet = 0;  // cycles since the last UART activity
    const uint64_t poll_every = 256;

    top->clk = 0;
    top->rst = 1;
    top->uart_rx = 1;
#ifdef SYSTOLIC_COMPUTE_HALF_PS
    // the compute clock: every edge of it before simulated time t (ps), in order
    const uint64_t clock_half_ps = SYSTOLIC_CLOCK_HALF_PS;
    uint64_t compute_edge_ps = SYSTOLIC_COMPUTE_FIRST_PS;
    top->compute_clk = 0;
    auto compute_edges_before = [&](uint64_t t) {
        while (compute_edge_ps < t) {
            top->compute_clk = !top->compute_clk;
            top->eval();
#ifdef SYSTOLIC_TRACE
            if (trace) trace->dump(compute_edge_ps);
#endif
            compute_edge_ps += SYSTOLIC_COMPUTE_HALF_PS;
        }
    };
#endif
    top->eval();
    int client = accept_client(listener, o);
    close(listener);
    double last_traffic = now_seconds();

    for (;;) {
        // one clock cycle: inputs, rising edge, outputs
        top->rst = cycle < static_cast<uint64_t>(o.reset_cycles);
        bool rx_line = top->rst ? true : to_device.step();
        top->uart_rx = rx_line;
#ifdef SYSTOLIC_COMPUTE_HALF_PS
        const uint64_t rise_time = 2 * cycle * clock_half_ps, fall_time = rise_time + clock_half_ps;
        compute_edges_before(rise_time);
#else
        const uint64_t rise_time = 2 * cycle, fall_time = rise_time + 1;
#endif
        top->clk = 1;
        top->eval();
#ifdef SYSTOLIC_TRACE
        if (trace) trace->dump(rise_time);
#endif
#ifdef SYSTOLIC_COMPUTE_HALF_PS
        compute_edges_before(fall_time);
#endif
        top->clk = 0;
        top->eval();
#ifdef SYSTOLIC_TRACE
        if (trace) trace->dump(fall_time);
#endif
        ++cycle;
        bool tx_line = top->uart_tx;
        uint8_t byte;
        if (from_device.step(tx_line, &byte)) {
            if (!send_all(client, &byte, 1)) break;
            last_traffic = now_seconds();
        }
        bool active = !rx_line || !tx_line || to_device.busy() || from_device.active;
        quiet = active ? 0 : quiet + 1;

        if (o.max_cycles && cycle >= o.max_cycles) {
            fprintf(stderr, "soc_harness: stopped after --max-cycles %llu cycles\n",
                    static_cast<unsigned long long>(o.max_cycles));
            fflush(stderr);
            return 3;
        }
        if (cycle % poll_every == 0 && to_device.queue.empty()) {
            size_t before = to_device.queue.size();
            if (!receive(client, to_device.queue)) break;
            if (to_device.queue.size() != before) last_traffic = now_seconds();
        }
        if (quiet >= o.grace_cycles && !top->busy && to_device.queue.empty()) {
            // idle: sleep until the client sends something (no simulated time passes)
            struct pollfd p = {client, POLLIN, 0};
            int n = poll(&p, 1, 100);
            if (n < 0 && errno != EINTR) die_errno("poll");
            if (n > 0) {
                if (!receive(client, to_device.queue)) break;
                last_traffic = now_seconds();
                quiet = 0;
            } else if (now_seconds() - last_traffic > o.idle_seconds) {
                fprintf(stderr, "soc_harness: no traffic for %.1f s, exiting\n", o.idle_seconds);
                fflush(stderr);
                return 4;
            }
        }
    }
    // client disconnected
    top->final();
#ifdef SYSTOLIC_TRACE
    if (trace) trace->close();
#endif
    close(client);
    printf("soc_harness: client disconnected after %llu cycles (%llu framing errors)\n",
           static_cast<unsigned long long>(cycle),
           static_cast<unsigned long long>(from_device.framing_errors));
    return 0;
}
