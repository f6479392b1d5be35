"""Exception classes of the engine."""


class AutogenError(Exception):
    """Base class of every error the engine raises itself."""


class CompileError(AutogenError):
    """A kernel could not be generated or compiled."""


class ScheduleError(AutogenError):
    """A graph cannot be laid out as one fused loop nest."""
