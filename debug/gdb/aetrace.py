# Loaded by `aetrace debug` into gdb (aetrace-debug's GDB_SCRIPT): commands
# over the stub's `monitor` commands.
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


# The procedure stack, as the stub serves it at SHADOW (aetrace_debug::stub::
# SHADOW): frame count, then (pc, procedure entry) per frame, innermost first.
SHADOW = 0xAE7ACE0000000000
# Made-up stack addresses for frame ids: a frame's depth from the bottom
# of the stack identifies it across stops (`finish`, `next` compare ids).
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


class AetraceUnwinder(gdb.unwinder.Unwinder):
    """Frames from the stub's procedure stack. Saves only rip (every other
    register is unavailable, and saving one makes gdb drop the unwinder);
    the outermost frame's caller pc is 0, which ends the backtrace."""

    def __init__(self):
        super().__init__("aetrace")

    def __call__(self, pending_frame):
        try:
            frames = shadow_frames()
        except gdb.error:
            return None
        level = pending_frame.level()
        if level >= len(frames):
            return None
        pc, entry = frames[level]
        if int(pending_frame.read_register("rip")) != pc:
            return None
        depth = len(frames) - level
        info = pending_frame.create_unwind_info(FrameId(STACK_TOP - 0x100 * depth, entry or pc))
        caller = frames[level + 1][0] if level + 1 < len(frames) else 0
        info.add_saved_register("rip", u64(caller))
        return info


gdb.unwinder.register_unwinder(None, AetraceUnwinder(), replace=True)
try:
    # finish would print a made-up return value (rax is unavailable).
    gdb.execute("set print finish off")
except gdb.error:
    pass
