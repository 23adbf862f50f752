# Loaded by `aetrace debug` into gdb (aetrace-debug's GDB_SCRIPT): commands
# over the stub's `monitor` commands.
import gdb


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
