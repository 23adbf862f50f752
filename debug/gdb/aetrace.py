# Loaded by `aetrace debug` into gdb (aetrace-debug's GDB_SCRIPT): commands
# over the stub's `monitor` commands (`seek`, `materialise`), the
# unwinder that builds frames from the stub's procedure stack, and the
# symbol of the made-up function `<untraced>` where the stub stands
# passages through untraced code.
import atexit
import os
import signal
import struct
import tempfile

import gdb
import gdb.unwinder


class Seek(gdb.Command):
    """seek N: go to instruction N of the thread (0 is its first)."""

    def __init__(self):
        super().__init__("seek", gdb.COMMAND_RUNNING)

    def invoke(self, arg, from_tty):
        gdb.execute("monitor seek " + arg)
        # The stub moved: gdb's cached registers and frames are stale.
        gdb.execute("maintenance flush register-cache")
        gdb.execute("frame")


Seek()


class Materialise(gdb.Command):
    """materialise: run the program again, natively, to the current
    instruction (`monitor materialise`), attach to it as a new inferior
    (`inferior 1` goes back to the trace) and map the callers' return
    addresses from the rewritten copies back to the original code."""

    def __init__(self):
        super().__init__("materialise", gdb.COMMAND_RUNNING)

    def invoke(self, arg, from_tty):
        reply = gdb.execute("monitor materialise", to_string=True)
        head = [l for l in reply.splitlines() if l.startswith("materialise pid ")]
        if not head:
            raise gdb.GdbError(reply.strip())
        w = head[0].split(None, 16)
        pid, base, pc = int(w[2]), int(w[4], 16), int(w[6], 16)
        park, code = int(w[8], 16), int(w[9], 16)
        copies, n, path = (int(w[11], 16), int(w[12], 16)), int(w[14]), w[16]
        frames = [
            tuple(int(x, 16) for x in l.split()[1:3])
            for l in reply.splitlines()
            if l.startswith("frame ")
        ]
        gdb.execute("add-inferior -no-connection", to_string=True)
        num = max(i.num for i in gdb.inferiors())
        gdb.execute("inferior %d" % num, to_string=True)
        gdb.execute("file " + path, to_string=True)
        try:
            gdb.execute("attach %d" % pid, to_string=True)
        except gdb.error:
            os.kill(pid, signal.SIGKILL)
            raise
        # An attach from Python in a session with two targets leaves the
        # attach's SIGSTOP to be reported at the next resume, and passed
        # on after: never stop on SIGSTOP, never pass it.
        gdb.execute("handle SIGSTOP nostop noprint nopass", to_string=True)
        # The process spins on a `jmp .` at `park`: the code and pc back.
        gdb.selected_inferior().write_memory(park, code.to_bytes(2, "little"))
        gdb.execute("set var $pc = %d" % pc)
        problem = map_returns(frames, copies)
        gdb.execute("maintenance flush register-cache")
        if problem is None:
            problem = check_frames(pc, [o for _, o in frames], (base, copies[1]))
        print(
            "aetrace: inferior %d is process %d, run again to instruction %d (%s); "
            "`inferior 1` goes back to the trace" % (num, pid, n - 1, path)
        )
        if problem:
            print("aetrace: the re-run diverged from the trace: " + problem)
        print(gdb.execute("frame", to_string=True), end="")


def map_returns(frames, copies):
    """Rewrites the return address of each caller frame in the copies
    (found by gdb's unwinder, the copies' CFI) with the original's, in the
    order of the trace's procedure stack: None, or what differs."""
    inf = gdb.selected_inferior()
    slots = []
    f = gdb.newest_frame().older()
    while f is not None and len(slots) < len(frames):
        pc = f.pc()
        copy, orig = frames[len(slots)]
        if pc == copy:
            slot = int(f.read_register("rsp")) - 8
            if read_u64s(slot, 1)[0] != pc:
                return "the return address %#x is not at %#x" % (pc, slot)
            slots.append((slot, orig))
        elif copies[0] <= pc < copies[1]:
            return "caller %d of the trace returns to %#x (in the copy: %#x), the re-run's to %#x" % (
                len(slots) + 1,
                orig,
                copy,
                pc,
            )
        f = f.older()
    if len(slots) < len(frames):
        return "the re-run has %d of the trace's %d callers" % (len(slots), len(frames))
    for slot, orig in slots:
        inf.write_memory(slot, orig.to_bytes(8, "little"))
    return None


def check_frames(pc, returns, exe):
    """The frames in the executable after the mapping, against the trace's
    procedure stack (pc, return addresses): None, or what differs."""
    got = []
    # The trace's stack goes on past main (to _start); gdb's stops there.
    past_main = gdb.parameter("backtrace past-main")
    gdb.execute("set backtrace past-main on")
    try:
        f = gdb.newest_frame()
        while f is not None:
            if exe[0] <= f.pc() < exe[1]:
                got.append(f.pc())
            f = f.older()
    finally:
        gdb.execute("set backtrace past-main " + ("on" if past_main else "off"))
        gdb.execute("maintenance flush register-cache")
    want = [pc] + returns
    if got != want:
        return "frames %s, the trace's %s" % (
            " ".join("%#x" % a for a in got),
            " ".join("%#x" % a for a in want),
        )
    return None


Materialise()


class WriteWatchpoint(gdb.Breakpoint):
    """An access watchpoint that stops only at writes: gdb's own `watch`
    stops only when the watched value changes, and a trace has addresses,
    not values (gdb reads <unreadable> before and after: no change)."""

    def __init__(self, start, length):
        spec = "*(char (*)[%d]) %#x" % (length, start)
        super().__init__(spec, gdb.BP_WATCHPOINT, gdb.WP_ACCESS)
        self.range = (start, start + length)

    def stop(self):
        reply = gdb.execute("monitor watch-hit", to_string=True).split()
        # "instruction P: K ADDR,SIZE ...", K in L (load), S, M (read and write).
        for kind, ref in zip(reply[2::2], reply[3::2]):
            addr, size = ref.split(",")
            a = int(addr, 16)
            if kind in "SM" and a < self.range[1] and self.range[0] < a + int(size):
                return True
        return False


class WatchWrite(gdb.Command):
    """watch-write EXPR: stop after each write to the bytes of EXPR (an
    lvalue: its address is watched, as `watch -l`), forwards and with
    reverse-continue before it. Needs a trace recorded with --data --check."""

    def __init__(self):
        super().__init__("watch-write", gdb.COMMAND_BREAKPOINTS, gdb.COMPLETE_EXPRESSION)

    def invoke(self, arg, from_tty):
        v = gdb.parse_and_eval(arg)
        if v.address is None:
            raise gdb.GdbError("watch-write: %s is not in memory" % arg)
        b = WriteWatchpoint(int(v.address), v.type.sizeof)
        print("Hardware write watchpoint %d: -location %s (aetrace: stops at writes)" % (b.number, arg))


WatchWrite()


# The procedure stack, as the stub serves it at SHADOW (aetrace_debug::stub::
# SHADOW): frame count, then (pc, procedure entry) per frame, innermost first.
SHADOW = 0xAE7ACE0000000000
# Made-up stack addresses for frame ids where the trace has no data
# references (or they leave a frame's address unknown): a frame's depth
# from the bottom of the stack identifies it across stops (`finish`,
# `next` compare ids). The stub serves the ids it uses (FRAME_IDS).
STACK_TOP = 0x7FF000000000


def read_u64s(addr, n):
    mem = gdb.selected_inferior().read_memory(addr, 8 * n)
    b = bytes(mem)
    return [int.from_bytes(b[8 * i : 8 * i + 8], "little") for i in range(n)]


def shadow_frames():
    (n,) = read_u64s(SHADOW, 1)
    if n == 0 or n > 1 << 20:
        return []
    words = read_u64s(SHADOW + 8, 2 * n)
    return [(words[2 * i], words[2 * i + 1]) for i in range(n)]


def u64(v):
    return gdb.Value(v).cast(gdb.lookup_type("unsigned long"))


class FrameId:
    def __init__(self, sp, pc):
        self.sp = u64(sp)
        self.pc = u64(pc)


def stack_index(pending_frame, ids):
    """The index in the procedure stack (whose frame ids are `ids`) of
    the frame gdb unwinds: one past the frame whose id its rsp is (the
    callee's saved rsp); 0 where its rsp is unavailable or below frame
    0's id (frame 0, or a function whose callee at frame 0 was inlined
    into it). Not gdb's frame level, which counts inlined functions
    (libc's): None where the rsp is none of these."""
    try:
        rsp = int(pending_frame.read_register("rsp"))
    except gdb.error:
        return 0
    for i in range(1, len(ids)):
        if ids[i - 1] == rsp:
            return i
    return 0 if ids and rsp < ids[0] else None


class AetraceUnwinder(gdb.unwinder.Unwinder):
    """Frames from the stub's procedure stack. Saves rip, and rsp and rbp
    as the stub serves them (FRAME_IDS, CALLER_RBP: real where the trace's
    data references give them, else made up from the frame's depth, or
    rbp not saved; every other register is left "not saved": gdb 13's
    Python unwinder cannot mark one unavailable, and drops itself for a
    frame where it saves an unavailable value). The outermost traced frame's caller is
    `<untraced>` (the code that started the thread: libc's start_thread),
    whose CFI ends the backtrace without reading a register; a caller
    frame whose own CFI ends the backtrace (`_start`) is left to gdb."""

    def __init__(self):
        super().__init__("aetrace")

    def __call__(self, pending_frame):
        try:
            frames = shadow_frames()
        except gdb.error:
            return None
        rip = int(pending_frame.read_register("rip"))
        if rip == SIGRETURN:
            # A signal handler's caller, or the return into it (where the
            # stub serves a made-up rsp): gdb's DWARF unwinder takes it as
            # a signal frame (`untraced_cfi`), `<signal handler called>`.
            return None
        ids = read_u64s(FRAME_IDS, len(frames))
        level = stack_index(pending_frame, ids)
        if level is None or frames[level][0] != rip:
            return None
        pc, entry = frames[level]
        if level > 0 and read_u64s(OUTERMOST + 8 * level, 1)[0]:
            # Its CFI leaves the return address undefined (glibc's
            # `_start`): gdb's DWARF unwinder ends the backtrace there,
            # as natively, from the made-up rsp saved for it.
            return None
        if entry == UNTRACED and level + 1 == len(frames):
            # What ran after a thread's last instruction, with no traced
            # caller: its CFI makes it the outermost frame, with the id it
            # has as a traced start routine's caller (`finish` stops there).
            return None
        cfa = ids[level]
        info = pending_frame.create_unwind_info(FrameId(cfa, entry or pc))
        caller = frames[level + 1][0] if level + 1 < len(frames) else UNTRACED + 1
        info.add_saved_register("rip", u64(caller))
        # The caller's rsp is this frame's CFA; its rbp what the stub
        # serves: real, or (made-up frame ids) 16 below its made-up CFA
        # where that is rbp-based, so that gdb's DWARF frame base of the
        # caller (`info frame`, `up`) reads a value; elsewhere (optimised
        # code, where rbp holds a variable) not saved: `<optimized out>`.
        info.add_saved_register("rsp", u64(cfa))
        known, rbp = read_u64s(CALLER_RBP + 16 * level, 2)
        if known:
            info.add_saved_register("rbp", u64(rbp))
        return info


gdb.unwinder.register_unwinder(None, AetraceUnwinder(), replace=True)


# The made-up function standing for untraced code that calls traced code
# back (aetrace_debug::untraced::UNTRACED and UNTRACED_SIZE): gdb steps
# over a function with a symbol and no line table as it does over libc.
UNTRACED = 0x7AE7ACE00000
UNTRACED_SIZE = 16
# A signal handler's caller, the restorer (aetrace_debug::untraced::SIGRETURN),
# and where the stub serves the frames' pcs by depth (stub::PCS_BY_DEPTH).
SIGRETURN = UNTRACED + 8
PCS_BY_DEPTH = SHADOW + (1 << 32)
# Per frame by level, 1 where its CFI leaves the return address undefined
# (stub::OUTERMOST).
OUTERMOST = SHADOW + (3 << 32)
# Per frame by level, its frame id's address (stub::FRAME_IDS), and the rbp
# its unwinder gives its caller: (1, value) or (0, 0), not saved
# (stub::CALLER_RBP).
FRAME_IDS = SHADOW + (4 << 32)
CALLER_RBP = SHADOW + (5 << 32)


def untraced_cfi():
    """A .debug_frame for `<untraced>`. Its first half: the CFA a
    constant and rip undefined, so gdb's DWARF unwinder takes an
    `<untraced>` frame the Python one leaves (the outermost: what started
    a thread) as the outermost frame, reading no register of the frame
    below it (one the Python unwinder did not save would be an error).
    Its second half, around SIGRETURN: a signal frame (augmentation "S":
    gdb shows `<signal handler called>` and looks the caller's function
    up at its pc, not pc - 1), whose caller's rip is the stub's pc of the
    frame two below the handler by depth (PCS_BY_DEPTH), and rsp and rbp
    made up as the stub makes frame ids without data (STACK_TOP - 0x100
    * depth: `<signal handler called>` makes every frame id made up)."""
    # CIE: id 0xffffffff, version 1, no augmentation, code alignment 1,
    # data alignment -8, return address rip (16); DW_CFA_def_cfa_expression
    # (DW_OP_lit0), DW_CFA_undefined rip, padding.
    plain = bytes([0x0F, 1, 0x30, 0x07, 16, 0, 0])
    # The signal frame's CFA: rsp (the handler's frame address) + 0x100,
    # the frame address one level out. Its caller's rip is at
    # PCS_BY_DEPTH + 8 * (its depth), its depth (STACK_TOP - CFA) / 0x100
    # - 1: DW_CFA_expression rip with the CFA pushed, then STACK_TOP,
    # swap, minus, 32, div, PCS_BY_DEPTH - 8, plus.
    where = (
        bytes([0x0E])
        + struct.pack("<Q", STACK_TOP)
        + bytes([0x16, 0x1C, 0x08, 32, 0x1B, 0x0E])
        + struct.pack("<Q", PCS_BY_DEPTH - 8)
        + bytes([0x22])
    )
    signal = (
        # DW_CFA_def_cfa rsp, 0x100
        bytes([0x0C, 7, 0x80, 0x02, 0x10, 16, len(where)])
        + where
        # DW_CFA_val_offset rsp, 0 (the CFA); DW_CFA_val_expression rbp,
        # DW_OP_plus_uconst 0xf0 (16 below the next frame address out).
        + bytes([0x14, 7, 0, 0x16, 6, 3, 0x23, 0xF0, 0x01])
    )

    def cie(augmentation, instructions):
        body = struct.pack("<IB", 0xFFFFFFFF, 1) + augmentation + bytes([0, 1, 0x78, 16]) + instructions
        return struct.pack("<I", len(body)) + body

    def fde(cie_at, start, size):
        body = struct.pack("<IQQ", cie_at, start, size)
        return struct.pack("<I", len(body)) + body

    # pc - 1 of a SIGRETURN caller is in the signal half.
    half = SIGRETURN - UNTRACED - 4
    first = cie(b"", plain) + fde(0, UNTRACED, half)
    second = cie(b"S", signal) + fde(len(first), UNTRACED + half, UNTRACED_SIZE - half)
    return first + second


def untraced_symbol_file(path):
    """Writes an ELF file whose symbols are the functions `<untraced>` at
    UNTRACED and `<restorer>` at SIGRETURN, its last half (a section
    without contents: the stub serves no bytes), with their CFI
    (`untraced_cfi`). The restorer is a function of its own, as libc's
    `__restore_rt` is natively, so that `next` from `<signal handler
    called>` steps out of it alone: into the untraced code a signal
    interrupted (`raise`), where natively gdb stops in libc."""
    names = b"\0.text\0.symtab\0.strtab\0.shstrtab\0.debug_frame\0"
    strtab = b"\0<untraced>\0<restorer>\0"
    # Symbols: the null one, then the two functions (global, in .text).
    half = SIGRETURN - UNTRACED
    symtab = (
        bytes(24)
        + struct.pack("<IBBHQQ", 1, 0x12, 0, 1, UNTRACED, half)
        + struct.pack("<IBBHQQ", 12, 0x12, 0, 1, SIGRETURN, UNTRACED_SIZE - half)
    )
    cfi = untraced_cfi()
    body = symtab + strtab + names + cfi
    shoff = 64 + len(body)
    offs = (64, 64 + len(symtab), 64 + len(symtab) + len(strtab), shoff - len(cfi))

    def sh(name, kind, flags, addr, off, size, link=0, info=0, align=1, entsize=0):
        return struct.pack("<IIQQQQIIQQ", name, kind, flags, addr, off, size, link, info, align, entsize)

    sections = (
        bytes(64)
        # .text: SHT_NOBITS, SHF_ALLOC | SHF_EXECINSTR
        + sh(1, 8, 6, UNTRACED, 64, UNTRACED_SIZE, align=16)
        # .symtab: SHT_SYMTAB, its strings in section 3, the globals from 1
        + sh(7, 2, 0, 0, offs[0], len(symtab), link=3, info=1, align=8, entsize=24)
        + sh(15, 3, 0, 0, offs[1], len(strtab))
        + sh(23, 3, 0, 0, offs[2], len(names))
        # .debug_frame: SHT_PROGBITS
        + sh(33, 1, 0, 0, offs[3], len(cfi))
    )
    ident = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    # ET_EXEC, EM_X86_64, no program headers, 6 sections, names in 4.
    header = ident + struct.pack("<HHIQQQIHHHHHH", 2, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, 6, 4)
    with open(path, "wb") as f:
        f.write(header + body + sections)


def add_untraced_symbol():
    fd, path = tempfile.mkstemp(prefix="aetrace-untraced-", suffix=".elf")
    os.close(fd)
    # gdb may reopen the file while the session lasts.
    atexit.register(os.unlink, path)
    untraced_symbol_file(path)
    gdb.execute("add-symbol-file %s -s .text %#x" % (path, UNTRACED), to_string=True)


add_untraced_symbol()
# One thread moves per command (the stub replays threads independently);
# under scheduler locking gdb names it in every resume packet, also after
# `info threads` left its register cache on the selected thread.
gdb.execute("set scheduler-locking on")
try:
    # finish would print a made-up return value (rax is unavailable).
    gdb.execute("set print finish off")
except gdb.error:
    pass
